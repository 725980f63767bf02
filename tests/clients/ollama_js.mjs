// Ollama's own JavaScript client (ollama-js) against a running omlx-site: every call an Ollama
// front end makes, each checked, one JSON line per call on stdout. Exits 1 at the first failure.
//     OMLX_URL=http://127.0.0.1:8000 OMLX_MODEL=... OMLX_EMBED_MODEL=... [OMLX_KEY=...] node ollama_js.mjs
import { Ollama } from "ollama";
import assert from "node:assert/strict";

const model = process.env.OMLX_MODEL;
const embedModel = process.env.OMLX_EMBED_MODEL;
const headers = process.env.OMLX_KEY ? { Authorization: `Bearer ${process.env.OMLX_KEY}` } : {};
const ollama = new Ollama({ host: process.env.OMLX_URL, headers });
const options = { num_predict: 8, temperature: 0 };
const user = [{ role: "user", content: "Say hi." }];

const checks = {
  async version() {
    const { version } = await ollama.version();
    assert.match(version, /^\d+\.\d+\.\d+/);
    return version;
  },
  async list() {
    const { models } = await ollama.list();
    const names = models.map((m) => m.name);
    assert.ok(names.includes(`${model}:latest`), names.join(","));   // Ollama's names carry a tag
    return names;
  },
  async chat() {
    const whole = await ollama.chat({ model, messages: user, options });
    assert.ok(whole.done && whole.message.role === "assistant" && whole.message.content);
    assert.ok(whole.eval_count >= 1 && whole.prompt_eval_count > 0 && whole.total_duration > 0);
    let streamed = "";
    let last;
    for await (const part of await ollama.chat({ model, messages: user, options, stream: true })) {
      streamed += part.message.content;
      last = part;
    }
    assert.ok(last.done && ["stop", "length"].includes(last.done_reason));
    assert.equal(streamed, whole.message.content);
    return whole.message.content;
  },
  async tools() {
    const tools = [{ type: "function", function: { name: "get_weather", description: "Weather in a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
    const answer = await ollama.chat({ model, tools, options: { num_predict: 64 },
      messages: [{ role: "user", content: "What is the weather in Paris?" }] });
    for (const call of answer.message.tool_calls ?? []) {
      assert.equal(call.function.name, "get_weather");
      assert.equal(typeof call.function.arguments, "object");
    }
    const follow = await ollama.chat({ model, tools, options: { num_predict: 16 }, messages: [
      { role: "user", content: "What is the weather in Paris?" },
      { role: "assistant", content: "", tool_calls: [{ function: { name: "get_weather", arguments: { city: "Paris" } } }] },
      { role: "tool", content: "sunny, 21 C", tool_name: "get_weather" }] });
    assert.ok(follow.done && follow.message.role === "assistant");
    return (answer.message.tool_calls ?? []).length;
  },
  async format() {
    const format = { type: "object", properties: { name: { type: "string", maxLength: 12 } },
      required: ["name"], additionalProperties: false };
    const answer = await ollama.chat({ model, format, options: { num_predict: 40 },
      messages: [{ role: "user", content: "Name a city as JSON." }] });
    assert.deepEqual(Object.keys(JSON.parse(answer.message.content)), ["name"]);
    return answer.message.content;
  },
  async generate() {
    const answer = await ollama.generate({ model, prompt: "1, 2, 3,", raw: true, options });
    assert.ok(answer.done && answer.response);
    return answer.response;
  },
  async ps() {
    const { models } = await ollama.ps();
    const here = models.find((m) => m.model.startsWith(model));
    assert.ok(here && here.size > 0 && here.size_vram >= 0 && here.expires_at);
    return { size: here.size, expires_at: here.expires_at };
  },
  async show() {
    const card = await ollama.show({ model });
    assert.ok(card.capabilities.includes("completion") && card.template);
    assert.ok(Object.entries(card.model_info).some(([key, n]) => key.endsWith(".context_length") && n > 0));
    return card.capabilities;
  },
  async embed() {
    const { embeddings } = await ollama.embed({ model: embedModel, input: ["first", "second"] });
    assert.equal(embeddings.length, 2);
    assert.ok(embeddings[0].length > 0);
    return embeddings[0].length;
  },
  async errors() {
    await assert.rejects(ollama.chat({ model: "no-such-model", messages: user }),
      (e) => e.status_code === 404 && e.error.includes("no-such-model"));
    assert.equal((await ollama.pull({ model })).status, "success");        // a model here is pulled already
    await assert.rejects(ollama.pull({ model: "no-such-model" }),
      (e) => e.status_code >= 400 && e.error.includes("import_gguf"));
    return "ok";
  },
};

for (const [name, check] of Object.entries(checks)) {
  try {
    console.log(JSON.stringify({ check: name, ok: true, value: await check() }));
  } catch (error) {
    console.log(JSON.stringify({ check: name, ok: false, error: String(error?.stack ?? error) }));
    process.exit(1);
  }
}
