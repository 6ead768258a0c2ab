"""`pipeline serve`: a local training-job service (FastAPI on uvicorn) over the same stage chain as `make all`.

store.py   the job table in SQLite (WAL): what survives a killed server
uploads.py a zip upload checked whole before a byte is extracted, then extracted into the job's folder only
runner.py  one queue per device; each job's stages run as child processes `python -m pipeline ...`
app.py     the HTTP API, bearer-token auth, server-sent progress events, the web page (page.html)

options.py what a job may ask for: PretrainConfig's fields, the export groups, the configs a job starts from

Nothing here imports torch, a stage or the CLI: the options are read from the torch-free configs and format table,
the device `auto` picks from a short-lived child (options.describe), and the jobs themselves run in children, so
the server stays small and starts fast.
"""
