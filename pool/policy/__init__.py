"""Pure memory policy, by topic: `admission` (who to evict for a load), `pressure` (the enforcer's
levels and actions), `idle` (TTL and keep-alive). `vocabulary` holds the words they share.

Nothing here touches MLX, Django, the clock or the event loop: the pool and the enforcer build
plain views and readings, pass times in, and apply the returned plans and actions."""
