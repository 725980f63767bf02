"""The engine pool: models, engines, serving, the enforcer and their routes. Importing it sets up
nothing in the process: entry points call omlx_site.process.setup_process() first."""
