"""`pipeline serve`: a local training-job service (FastAPI on uvicorn) over the same stage chain as `make all`.

options.py what a job may ask for: PretrainConfig's fields, the export groups, the configs a job starts from, and
           the machine's devices (from a short-lived child)
store.py   the job table in SQLite (WAL): what survives a killed server
uploads.py a zip upload checked whole before a byte is extracted, then extracted into the job's folder only
runner.py  one queue per device; each job's stages run as child processes `python -m pipeline ...`
checks.py  what a submission must hold to succeed: options across each other, the machine, images enough
users.py   who may call: one token, or a users file with one token each (each user sees only their own jobs)
limits.py  disk quota, jobs per user, deadlines on request heads and bodies, a cap on open connections
app.py     the HTTP API, server-sent progress events, the log view, the web page (page.html)

Nothing here imports torch, a stage or the CLI: the options are read from the torch-free configs, backbone and
format tables, the machine's devices from a short-lived child (options.describe), and the jobs themselves run in
children, so the server stays small and starts fast.
"""
