"""`pipeline serve`: a local training-job service (FastAPI on uvicorn) over the same stage chain as `make all`.

store.py   the job table in SQLite (WAL): what survives a killed server
uploads.py a zip upload checked whole before a byte is extracted, then extracted into the job's folder only
runner.py  one queue per device; each job's stages run as child processes `python -m pipeline ...`
app.py     the HTTP API, bearer-token auth, server-sent progress events, the web page (page.html)

Nothing here imports torch or another stage module: the pretraining options are read once from a child process
(options.py), and the jobs themselves run in children, so the server stays small and starts fast.
"""
