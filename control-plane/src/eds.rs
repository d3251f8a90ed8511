//! Envoy endpoint discovery (EDS) over REST: the worker pools as Envoy clusters.
//!
//! Envoy polls `POST /v3/discovery:endpoints` with a JSON `DiscoveryRequest` every
//! `refresh_delay` and gets a `DiscoveryResponse` of `ClusterLoadAssignment`s:
//! [`DECODE_CLUSTER`] holds every live decode and agg worker, [`PREFILL_CLUSTER`] every live
//! prefill worker, whatever their model; and each model's workers are also in that role's
//! cluster for the model alone ([`model_cluster`]: `switchyard_decode__<model>`), which a
//! gateway serving several models routes a failed-open request to (docs/vllm.md, "Several
//! models"). Why EDS rather than generated static config: pools change (workers start,
//! restart, die) without restarting or reloading Envoy, and when the control plane is down
//! Envoy keeps the last endpoints it accepted, so routing fails open instead of emptying.
//!
//! `version_info` is a hash of the membership, so it changes exactly when membership does
//! (and is the same across control-plane restarts with the same pool).
//!
//! Only the JSON shape matters here; this module is pure (workers in, response out).

use std::hash::{Hash, Hasher};
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

pub use switchyard_protocol::route::{model_cluster, DECODE_CLUSTER, PREFILL_CLUSTER};

use crate::router::WorkerView;

/// Path Envoy's REST EDS subscription polls.
pub const EDS_PATH: &str = "/v3/discovery:endpoints";
/// Type URL of the resources served.
pub const CLUSTER_LOAD_ASSIGNMENT_TYPE: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// Envoy's `DiscoveryRequest` (the fields we read; others are ignored). Protobuf JSON may use
/// either the proto field names or lowerCamelCase, so both are accepted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DiscoveryRequest {
    /// Version Envoy last accepted (empty on the first poll).
    #[serde(default, alias = "versionInfo")]
    pub version_info: String,
    /// Clusters Envoy wants; empty means all.
    #[serde(default, alias = "resourceNames")]
    pub resource_names: Vec<String>,
    /// Resource type Envoy expects.
    #[serde(default, alias = "typeUrl")]
    pub type_url: String,
    /// Nonce of the response being acknowledged.
    #[serde(default, alias = "responseNonce")]
    pub response_nonce: String,
    /// Set when Envoy rejected the previous response (NACK): logged by the caller.
    #[serde(
        default,
        alias = "errorDetail",
        skip_serializing_if = "Option::is_none"
    )]
    pub error_detail: Option<serde_json::Value>,
}

/// Envoy's `DiscoveryResponse`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiscoveryResponse {
    /// Membership version.
    pub version_info: String,
    /// One assignment per requested cluster.
    pub resources: Vec<ClusterLoadAssignment>,
    /// [`CLUSTER_LOAD_ASSIGNMENT_TYPE`].
    pub type_url: String,
    /// Echoed back by Envoy in its next request.
    pub nonce: String,
}

/// `envoy.config.endpoint.v3.ClusterLoadAssignment`, as an `Any` (with `@type`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterLoadAssignment {
    /// [`CLUSTER_LOAD_ASSIGNMENT_TYPE`].
    #[serde(rename = "@type")]
    pub type_url: String,
    /// Which cluster.
    pub cluster_name: String,
    /// One locality holding every endpoint (empty list when the pool is empty).
    pub endpoints: Vec<LocalityLbEndpoints>,
}

/// `LocalityLbEndpoints` (no locality: the pool is flat).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalityLbEndpoints {
    /// The endpoints.
    pub lb_endpoints: Vec<LbEndpoint>,
}

/// `LbEndpoint`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LbEndpoint {
    /// The endpoint.
    pub endpoint: EndpointSpec,
}

/// `Endpoint`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointSpec {
    /// Where it listens.
    pub address: Address,
    /// The worker id, shown in Envoy's admin `/clusters` output.
    pub hostname: String,
}

/// `config.core.v3.Address`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Address {
    /// TCP address.
    pub socket_address: SocketAddress,
}

/// `config.core.v3.SocketAddress`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SocketAddress {
    /// IP address (EDS endpoints must be IPs; Envoy does not resolve names here).
    pub address: String,
    /// Port.
    pub port_value: u16,
}

/// A pool member: its clusters, worker id and socket address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Member {
    /// Its role's cluster, every model's workers together.
    cluster: &'static str,
    // Sorted by cluster, then address: each cluster's endpoints in address order.
    address: SocketAddr,
    worker: String,
    /// Its role's cluster for its model alone ([`model_cluster`]).
    model_cluster: String,
}

impl Member {
    fn is_in(&self, cluster: &str) -> bool {
        self.cluster == cluster || self.model_cluster == cluster
    }
}

/// Which clusters a worker belongs to; workers whose address is not `ip:port` are left out
/// (Envoy would reject the whole update for one bad endpoint) and returned separately so
/// the caller can log them.
fn members(workers: &[WorkerView]) -> (Vec<Member>, Vec<String>) {
    let mut members = Vec::with_capacity(workers.len());
    let mut unusable = Vec::new();
    for w in workers {
        let cluster = if w.info.role.serves_decode() {
            DECODE_CLUSTER
        } else {
            PREFILL_CLUSTER
        };
        match w.info.address.parse::<SocketAddr>() {
            Ok(address) => members.push(Member {
                cluster,
                address,
                worker: w.info.worker_id.0.clone(),
                model_cluster: model_cluster(cluster, &w.info.model),
            }),
            Err(_) => unusable.push(w.info.worker_id.0.clone()),
        }
    }
    members.sort();
    (members, unusable)
}

/// Whether `name` is a cluster this EDS serves: a role's cluster, or a role's cluster for one
/// model (served, empty, even before any worker of that model is live, so Envoy's cluster
/// warms up and fails open to no host rather than waiting).
fn is_known(name: &str) -> bool {
    [DECODE_CLUSTER, PREFILL_CLUSTER].iter().any(|c| {
        name == *c
            || name
                .strip_prefix(c)
                .and_then(|rest| rest.strip_prefix("__"))
                .is_some_and(|slug| !slug.is_empty())
    })
}

/// The membership version: a hash of the sorted members, as 16 hex digits.
fn version(members: &[Member]) -> String {
    let mut hasher = std::hash::DefaultHasher::new();
    members.hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Builds the response to `request` from the live workers. Returns the response and the ids
/// of workers left out because their address is not `ip:port`.
pub fn respond(
    request: &DiscoveryRequest,
    workers: &[WorkerView],
) -> (DiscoveryResponse, Vec<String>) {
    let (members, unusable) = members(workers);
    let version_info = version(&members);
    let wanted: Vec<String> = if request.resource_names.is_empty() {
        // Everything: the two role clusters, then each live model's, in name order.
        let mut per_model: Vec<String> = members.iter().map(|m| m.model_cluster.clone()).collect();
        per_model.sort();
        per_model.dedup();
        [DECODE_CLUSTER, PREFILL_CLUSTER]
            .into_iter()
            .map(String::from)
            .chain(per_model)
            .collect()
    } else {
        let mut wanted: Vec<String> = Vec::new();
        for name in &request.resource_names {
            if is_known(name) && !wanted.contains(name) {
                wanted.push(name.clone());
            }
        }
        wanted
    };
    let resources = wanted
        .into_iter()
        .map(|cluster| {
            let lb_endpoints: Vec<LbEndpoint> = members
                .iter()
                .filter(|m| m.is_in(&cluster))
                .map(|m| LbEndpoint {
                    endpoint: EndpointSpec {
                        address: Address {
                            socket_address: SocketAddress {
                                address: m.address.ip().to_string(),
                                port_value: m.address.port(),
                            },
                        },
                        hostname: m.worker.clone(),
                    },
                })
                .collect();
            ClusterLoadAssignment {
                type_url: CLUSTER_LOAD_ASSIGNMENT_TYPE.to_string(),
                cluster_name: cluster,
                endpoints: if lb_endpoints.is_empty() {
                    Vec::new()
                } else {
                    vec![LocalityLbEndpoints { lb_endpoints }]
                },
            }
        })
        .collect();
    let response = DiscoveryResponse {
        nonce: version_info.clone(),
        version_info,
        resources,
        type_url: CLUSTER_LOAD_ASSIGNMENT_TYPE.to_string(),
    };
    (response, unusable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_protocol::worker::{WorkerId, WorkerInfo, WorkerRole};

    fn worker(id: &str, role: WorkerRole, address: &str) -> WorkerView {
        WorkerView {
            info: WorkerInfo {
                worker_id: WorkerId(id.into()),
                instance_id: 1,
                role,
                address: address.into(),
                model: "m".into(),
                block_size: 16,
                kv_capacity_blocks: 100,
                engine: Default::default(),
                bootstrap_port: None,
            },
            last_seen_ms: 0,
            in_flight: 0,
        }
    }

    #[test]
    fn pools_split_by_role_and_serialize_as_envoy_expects() {
        let workers = vec![
            worker("decode-0", WorkerRole::Decode, "127.0.0.1:9001"),
            worker("agg-0", WorkerRole::Agg, "127.0.0.1:9003"),
            worker("prefill-0", WorkerRole::Prefill, "127.0.0.1:9002"),
        ];
        let (resp, unusable) = respond(&DiscoveryRequest::default(), &workers);
        assert!(unusable.is_empty());
        let json = serde_json::to_value(&resp).unwrap();
        assert_eq!(json["type_url"], CLUSTER_LOAD_ASSIGNMENT_TYPE);
        let decode = &json["resources"][0];
        assert_eq!(decode["@type"], CLUSTER_LOAD_ASSIGNMENT_TYPE);
        assert_eq!(decode["cluster_name"], DECODE_CLUSTER);
        let eps = decode["endpoints"][0]["lb_endpoints"].as_array().unwrap();
        assert_eq!(eps.len(), 2);
        assert_eq!(
            eps[0]["endpoint"]["address"]["socket_address"],
            serde_json::json!({"address": "127.0.0.1", "port_value": 9001})
        );
        assert_eq!(json["resources"][1]["cluster_name"], PREFILL_CLUSTER);
        // Round trip.
        let back: DiscoveryResponse = serde_json::from_value(json).unwrap();
        assert_eq!(back, resp);
    }

    #[test]
    fn version_changes_only_with_membership() {
        let a = worker("decode-0", WorkerRole::Decode, "127.0.0.1:9001");
        let mut busy = a.clone();
        busy.in_flight = 7;
        busy.last_seen_ms = 99;
        let b = worker("decode-1", WorkerRole::Decode, "127.0.0.1:9002");
        let req = DiscoveryRequest::default();
        let v1 = respond(&req, std::slice::from_ref(&a)).0.version_info;
        assert_eq!(v1, respond(&req, &[busy]).0.version_info);
        let v2 = respond(&req, &[a.clone(), b.clone()]).0.version_info;
        assert_ne!(v1, v2);
        assert_eq!(v2, respond(&req, &[b, a]).0.version_info);
    }

    proptest::proptest! {
        /// The version depends on the membership set only: not on order, load or liveness
        /// timestamps; and adding a member changes it.
        #[test]
        fn version_is_a_function_of_the_membership_set(
            ports in proptest::collection::btree_set(1_000u16..60_000, 1..12),
            rotate in 0usize..12,
            busy in 0u32..100,
        ) {
            let workers: Vec<WorkerView> = ports
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let role = if i % 3 == 0 { WorkerRole::Prefill } else { WorkerRole::Decode };
                    worker(&format!("w{p}"), role, &format!("127.0.0.1:{p}"))
                })
                .collect();
            let req = DiscoveryRequest::default();
            let base = respond(&req, &workers).0.version_info;
            let mut shuffled = workers.clone();
            shuffled.rotate_left(rotate % workers.len());
            for w in &mut shuffled {
                w.in_flight = busy;
                w.last_seen_ms = u64::from(busy) * 7;
            }
            proptest::prop_assert_eq!(&base, &respond(&req, &shuffled).0.version_info);
            let mut grown = workers.clone();
            grown.push(worker("extra", WorkerRole::Decode, "127.0.0.1:61000"));
            proptest::prop_assert_ne!(&base, &respond(&req, &grown).0.version_info);
        }
    }

    #[test]
    fn requests_in_camel_case_and_unknown_clusters_are_handled() {
        let req: DiscoveryRequest = serde_json::from_str(
            r#"{"versionInfo":"x","resourceNames":["switchyard_prefill","other"],"node":{"id":"envoy"}}"#,
        )
        .unwrap();
        let workers = vec![worker("p", WorkerRole::Prefill, "not-an-ip:80")];
        let (resp, unusable) = respond(&req, &workers);
        assert_eq!(unusable, vec!["p".to_string()]);
        assert_eq!(resp.resources.len(), 1);
        assert_eq!(resp.resources[0].cluster_name, PREFILL_CLUSTER);
        assert!(resp.resources[0].endpoints.is_empty());
    }

    #[test]
    fn each_model_has_its_own_clusters_beside_the_shared_ones() {
        let of = |id: &str, role, address: &str, model: &str| {
            let mut w = worker(id, role, address);
            w.info.model = model.into();
            w
        };
        let workers = vec![
            of("a-d", WorkerRole::Decode, "127.0.0.1:9001", "org/a-1.0"),
            of("a-p", WorkerRole::Prefill, "127.0.0.1:9002", "org/a-1.0"),
            of("b-d", WorkerRole::Agg, "127.0.0.1:9003", "b"),
        ];
        let hosts = |resp: &DiscoveryResponse, cluster: &str| -> Vec<String> {
            resp.resources
                .iter()
                .filter(|r| r.cluster_name == cluster)
                .flat_map(|r| r.endpoints.iter().flat_map(|e| e.lb_endpoints.iter()))
                .map(|e| e.endpoint.hostname.clone())
                .collect()
        };
        let (all, _) = respond(&DiscoveryRequest::default(), &workers);
        let names: Vec<&str> = all
            .resources
            .iter()
            .map(|r| r.cluster_name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                DECODE_CLUSTER,
                PREFILL_CLUSTER,
                "switchyard_decode__b",
                "switchyard_decode__org_a-1_0",
                "switchyard_prefill__org_a-1_0"
            ]
        );
        assert_eq!(hosts(&all, DECODE_CLUSTER), ["a-d", "b-d"]);
        assert_eq!(hosts(&all, "switchyard_decode__org_a-1_0"), ["a-d"]);
        assert_eq!(hosts(&all, "switchyard_decode__b"), ["b-d"]);
        // Asked by name, as each Envoy EDS cluster asks: a model with no live worker gets an
        // empty assignment; a name outside the scheme gets nothing.
        let req = DiscoveryRequest {
            resource_names: vec![
                "switchyard_decode__c".into(),
                "switchyard_decode__".into(),
                "switchyard_decodeX".into(),
            ],
            ..DiscoveryRequest::default()
        };
        let (named, _) = respond(&req, &workers);
        assert_eq!(named.resources.len(), 1);
        assert_eq!(named.resources[0].cluster_name, "switchyard_decode__c");
        assert!(named.resources[0].endpoints.is_empty());
    }
}
