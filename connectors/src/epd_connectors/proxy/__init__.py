"""The E/P/D request proxy: an OpenAI-compatible front that sends media to encoders, then prefill and decode.

vLLM ships no production proxy for encoder-disaggregated serving, only an example script. This package is the
router the operator deploys (`epd-launch proxy` execs `epd-proxy`): the routing policy lives in pure modules
(`media`, `rewrite`, `kv`, `routing`, `discovery_slices`), the I/O in `backend`, `flow`, `health`, `discovery`
and the `app` its own HTTP `server` serves. `local` starts one on loopback for tests against real vLLM.
"""
