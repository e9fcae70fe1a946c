"""`epd-launch ROLE --bundle PATH`: validate the role's bundle, write the files it implies, wait for what the
role depends on, then replace this process with the real one (mooncake_master, mooncake_client, vLLM, proxy).

The sequence is deliberately short: `plan` (pure: bundle -> argv, env, files, waits), `readiness` (polls with
progress lines and a deadline), `cli` (the thin shell that does the I/O and the exec).
"""
