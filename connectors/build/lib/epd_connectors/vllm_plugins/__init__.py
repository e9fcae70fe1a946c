"""vLLM plugins shipped with the connector library (registered under vLLM's ``vllm.general_plugins`` entry point).

vLLM calls each plugin function in every process it starts (API server, engine core, workers). Nothing here
imports vLLM at module level: importing ``epd_connectors`` never needs vLLM; the plugin functions import it only
when vLLM itself calls them.
"""
