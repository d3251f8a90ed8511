#!/usr/bin/env python3
# Usage (from the repository root, after building the filter):
#   python3 envoy/istio/validate_fragments.py . target/wasm32-wasip1/wasm/switchyard_filter.wasm > /tmp/istio-bootstrap.json
#   .venv/bin/envoy --mode validate --use-dynamic-base-id -c /tmp/istio-bootstrap.json
# Needs PyYAML. Checks the Envoy parts only; Istio itself is not exercised.
# Embeds the Envoy fragments of envoy/istio/*.yaml into a standalone bootstrap
# (Istio cluster names mapped to static clusters) for Envoy to validate.
import json, sys, yaml
root = sys.argv[1]
wasm_path = sys.argv[2]
ef = yaml.safe_load(open(f"{root}/envoy/istio/envoyfilter-switchyard.yaml"))
wasm = ef["spec"]["configPatches"][0]["patch"]["value"]
wasm["typed_config"]["config"]["vm_config"]["code"] = {"local": {"filename": wasm_path}}
oh = yaml.safe_load(open(f"{root}/envoy/istio/envoyfilter-override-host.yaml"))
patches = oh["spec"]["configPatches"]
def cluster(name, patch=None, port=9):
    c = {"name": name, "type": "STATIC", "connect_timeout": "1s",
         "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
             {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}}
    if patch: c.update(patch)
    return c
cfg = json.loads(wasm["typed_config"]["config"]["configuration"]["value"])
clusters = [
    cluster(cfg["control_plane_cluster"]),
    cluster("outbound|8000||vllm-decode.llm.svc.cluster.local", patches[0]["patch"]["value"]),
    cluster(cfg["prefill_cluster"], patches[1]["patch"]["value"]),
]
listener = {"name": "gw", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
  "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    "stat_prefix": "gw",
    "route_config": {"virtual_hosts": [{"name": "llm", "domains": ["*"], "routes": [{"match": {"prefix": "/v1/"},
        "route": {"cluster": "outbound|8000||vllm-decode.llm.svc.cluster.local", "timeout": "0s"}}]}]},
    "http_filters": [wasm, {"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}
listener.update(patches[2]["patch"]["value"])
hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
hcm.update({k: v for k, v in patches[3]["patch"]["value"]["typed_config"].items() if k != "@type"})
print(json.dumps({"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
  "static_resources": {"listeners": [listener], "clusters": clusters}}))
