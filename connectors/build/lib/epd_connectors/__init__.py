"""epd-connectors: what every E/P/D role pod runs.

`config` holds the typed runtime settings (Mooncake JSON, master and store-client flags, EC/KV transfer
configs, the per-role bundle), `launch` turns a bundle into a running process, `proxy` routes requests.
Importing this package must not need kopf or the Kubernetes client.
"""

__version__ = "0.1.0"
