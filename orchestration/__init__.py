"""Flows that run other flows: replay walks a backfill's dates through the flows the
registry (``flows.catalog``) names. It sits above the flows it runs."""
