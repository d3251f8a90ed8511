#!/usr/bin/env python3
# Usage (from the repository root, after building the filter; scripts/test.sh runs it):
#   .venv/bin/python envoy/istio/validate_fragments.py . target/wasm32-wasip1/wasm/switchyard_filter.wasm > /tmp/istio-bootstrap.json
#   .venv/bin/envoy --mode validate --use-dynamic-base-id -c /tmp/istio-bootstrap.json
# Needs PyYAML (scripts/setup.sh installs it in .venv). No Istio runs here: what it checks of
# Istio's side is the route timeout rule below, read in Istio's source, and the project's own
# proxyVersion rule. Embeds the Envoy fragments of envoy/istio/*.yaml into a standalone bootstrap
# (Istio cluster names mapped to static clusters) for Envoy to validate: the wasm filter, both
# pool cluster patches, the listener patch and the connection manager patch. Patches are found
# by what they apply to, not by position, and every patch must be used. Before printing it
# also checks what Envoy cannot: every YAML file parses, every EnvoyFilter patch carries the
# proxyVersion match and it admits Istio 1.28+ and nothing older, and no VirtualService sets a
# route timeout Istio refuses (under 1 ms, `0s` included).
import glob, json, re, sys, yaml
root = sys.argv[1]
wasm_path = sys.argv[2]
def fail(msg):
    sys.exit(f"validate_fragments: {msg}")
docs = {}
for path in sorted(glob.glob(f"{root}/envoy/istio/*.yaml")):
    docs[path.rsplit("/", 1)[1]] = [d for d in yaml.safe_load_all(open(path)) if d]
for name, objs in docs.items():
    for obj in objs:
        if obj.get("kind") == "EnvoyFilter":
            for i, cp in enumerate(obj["spec"]["configPatches"]):
                ver = cp.get("match", {}).get("proxy", {}).get("proxyVersion")
                if not ver:
                    fail(f"{name}: patch {i} has no match.proxy.proxyVersion")
                # Istio matches it (Go regexp) against the proxy's ISTIO_VERSION.
                for v in ["1.28.0", "1.28.2-distroless", "1.29.1", "1.30.0"]:
                    if not re.search(ver, v):
                        fail(f"{name}: patch {i}: proxyVersion {ver!r} refuses {v}")
                for v in ["1.27.3", "1.2.0", "1.20.0", "1.9.0"]:
                    if re.search(ver, v):
                        fail(f"{name}: patch {i}: proxyVersion {ver!r} admits {v}")
        if obj.get("kind") == "VirtualService":
            for r in obj["spec"].get("http", []):
                t = r.get("timeout")
                if t is not None:
                    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(t))
                    scale = {"ms": 1, "s": 1e3, "m": 6e4, "h": 3.6e6}
                    if not m or float(m.group(1)) * scale[m.group(2)] < 1:
                        fail(f"{name}: route {r.get('name')}: timeout {t!r} (Istio refuses < 1ms)")
def envoyfilter(name):
    [ef] = [o for o in docs[name] if o.get("kind") == "EnvoyFilter"]
    return ef["spec"]["configPatches"]
[wasm_patch] = envoyfilter("envoyfilter-switchyard.yaml")
wasm = wasm_patch["patch"]["value"]
wasm["typed_config"]["config"]["vm_config"]["code"] = {"local": {"filename": wasm_path}}
patches = envoyfilter("envoyfilter-override-host.yaml")
used = set()
def patch(apply_to, service=None):
    found = [i for i, p in enumerate(patches) if p["applyTo"] == apply_to
             and (service is None or p["match"]["cluster"]["service"] == service)]
    if len(found) != 1:
        fail(f"expected one {apply_to} patch {service or ''}, found {len(found)}")
    used.add(found[0])
    return patches[found[0]]["patch"]["value"]
def cluster(name, patch=None, port=9):
    c = {"name": name, "type": "STATIC", "connect_timeout": "1s",
         "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
             {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}}
    if patch: c.update(patch)
    return c
cfg = json.loads(wasm["typed_config"]["config"]["configuration"]["value"])
clusters = [
    cluster(cfg["control_plane_cluster"]),
    cluster("outbound|8000||vllm-decode.llm.svc.cluster.local", patch("CLUSTER", "vllm-decode.llm.svc.cluster.local")),
    cluster(cfg["prefill_cluster"], patch("CLUSTER", "vllm-prefill.llm.svc.cluster.local")),
]
# Istio leaves the route timeout at 0 (disabled) when the VirtualService sets none.
listener = {"name": "gw", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
  "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    "stat_prefix": "gw",
    "route_config": {"virtual_hosts": [{"name": "llm", "domains": ["*"], "routes": [{"match": {"prefix": "/v1/"},
        "route": {"cluster": "outbound|8000||vllm-decode.llm.svc.cluster.local", "timeout": "0s"}}]}]},
    "http_filters": [wasm, {"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}
listener.update(patch("LISTENER"))
hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
hcm.update({k: v for k, v in patch("NETWORK_FILTER")["typed_config"].items() if k != "@type"})
if used != set(range(len(patches))):
    fail(f"envoyfilter-override-host.yaml: patches {sorted(set(range(len(patches))) - used)} not validated")
print(json.dumps({"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
  "static_resources": {"listeners": [listener], "clusters": clusters}}))
