"""The machinery every flow runs on: its parameters, the run over profiles (holds, the
chunk scheduler, the workspace), what it reports (report, artifacts, progress, events)
and the Prefect runtime around it. It sits below the flows, so a flow definition stays a
short list of its steps; nothing here names a flow."""
