"""Request traces (issue 23): one per model request, whatever its dialect. trace.py is the plain
object the serving path fills in, flow.py its hooks there, registry.py the in-flight ones and the
metrics, writer.py the database's writer thread, models.py the rows, queries.py the API's reads."""
