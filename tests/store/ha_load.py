"""A requester under load for the HA failover test (its own process: an HA client's close() waits up to 30 s for
its leader watch, Mooncake 0.3.13, so it ends with os._exit).

argv: CONFIG (the model as JSON, cluster_id included) SECONDS. Sets MC_STORE_CLUSTER_ID as epd-launch does,
puts one key it reads again at the end ("kept" or "lost"), prints when its loop began (time.monotonic(), one clock
for every process on Linux), then puts and reads back 64 KiB values in a loop, one JSON line per round trip.
"""

import json
import os
import sys
import time
from pathlib import Path

from epd_connectors import store_probe
from epd_connectors.config.mooncake import MooncakeStoreConfig

config = MooncakeStoreConfig.model_validate_json(Path(sys.argv[1]).read_text())
os.environ.update(config.env())
store = store_probe.open_store(config, "127.0.0.1")
store_probe.probe(store, "ha-load/before", b"b" * 4096)
began = time.monotonic()
print(json.dumps({"started": began}), flush=True)
until = began + float(sys.argv[2])
n = 0
while time.monotonic() < until:
    n += 1
    start = time.monotonic()
    try:
        store_probe.probe(store, f"ha-load/{n}", os.urandom(65536))
        error = ""
    except store_probe.StoreError as exc:
        error = str(exc)
    print(json.dumps({"t": start - began, "s": time.monotonic() - start, "error": error}), flush=True)
    time.sleep(0.05)
kept = store.get("ha-load/before") == b"b" * 4096
print(json.dumps({"before": "kept" if kept else "lost"}), flush=True)
os._exit(0)
