"""Who a request belongs to: the API keys (`--api-key`, or `--api-keys FILE` naming each key's tenant
and weight: api_keys.py) and the tenant a request is queued under for the workers' fair share
(tenants.py; docs/deployment.md#tenants-and-fair-share).

May import: queue_adapters.
"""
