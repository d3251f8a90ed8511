//! The REST API over real HTTP (service in-process, real nats-server): route-body errors,
//! runtime config, EDS.

use crate::common;

use common::*;
use serde_json::json;
use std::time::Duration;
use switchyard_control_plane::settings::{Redacted, Settings};
use switchyard_protocol::route::{ApiError, Reason, Verdict, REJECT_HEADER};
use switchyard_protocol::worker::WorkerRole;

/// A request the engine would refuse: the OpenAI error the client gets, with the
/// reason the filter relays it under.
async fn refused(resp: reqwest::Response, reason: &str, param: &str, mentions: &str) {
    assert_eq!(resp.status(), 400);
    assert_eq!(
        resp.headers()
            .get(REJECT_HEADER)
            .and_then(|v| v.to_str().ok()),
        Some(reason)
    );
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "BadRequestError", "{body}");
    assert_eq!(body["error"]["code"], 400, "{body}");
    assert_eq!(body["error"]["param"], param, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(mentions),
        "{body} should mention {mentions}"
    );
}

/// Bytes do not bound what a parsed body costs: 15 MiB of `{}` grew about 55× in the parse,
/// within the default body limit. A body of more values than the bound is refused, naming it,
/// and the service routes the next request as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_of_more_json_values_than_the_bound_is_refused_without_its_tree() {
    use switchyard_protocol::json_values::MAX_JSON_VALUES;
    let (_server, svc, nats) = service_with_nats(Settings::for_tests()).await;
    register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;
    let mut body = String::from(r#"{"model":"m","messages":["#);
    body.push_str(&"{},".repeat(MAX_JSON_VALUES));
    body.push_str(r#"{"role":"user","content":"hi"}]}"#);
    refused(
        route(&svc.base, "chat", None, body).await,
        "invalid_request",
        "body",
        "more than 524288 JSON values",
    )
    .await;
    let resp = route(&svc.base, "chat", None, chat("hello")).await;
    assert_eq!(resp.status(), 200);
    let verdict: Verdict = resp.json().await.unwrap();
    assert_eq!(verdict.decode.worker_id.0, "decode-0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_route_bodies_get_400_naming_the_problem() {
    let mut settings = Settings::for_tests();
    settings.max_route_body_bytes = 4_096;
    let (_server, svc, nats) = service_with_nats(settings).await;
    register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;

    /// Our own error (not the client's request at fault).
    async fn expect(resp: reqwest::Response, status: u16, code: &str, mentions: &str) {
        assert_eq!(resp.status(), status);
        assert!(resp.headers().get(REJECT_HEADER).is_none());
        let err: ApiError = resp.json().await.unwrap();
        assert_eq!(err.code, code, "{err:?}");
        assert!(
            err.message.contains(mentions),
            "{err:?} should mention {mentions}"
        );
    }
    let chat_with = |extra: serde_json::Value| {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body.to_string()
    };
    refused(
        route(&svc.base, "chat", None, "{\"messages\": [").await,
        "invalid_request",
        "body",
        "EOF",
    )
    .await;
    refused(
        route(&svc.base, "chat", None, "[1, 2]").await,
        "invalid_request",
        "body",
        "object",
    )
    .await;
    refused(
        route(&svc.base, "chat", None, json!({"model": "m"}).to_string()).await,
        "invalid_request",
        "messages",
        "messages",
    )
    .await;
    refused(
        route(
            &svc.base,
            "chat",
            None,
            json!({"messages": [{"role": "user", "content": 7}]}).to_string(),
        )
        .await,
        "invalid_request",
        "messages[0].content",
        "content",
    )
    .await;
    refused(
        route(
            &svc.base,
            "completions",
            None,
            json!({"model": "m"}).to_string(),
        )
        .await,
        "invalid_request",
        "prompt",
        "prompt",
    )
    .await;
    // What the engine refuses is refused before any worker does work for it.
    for (extra, param) in [
        (json!({"max_tokens": -1}), "max_tokens"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_tokens": 1e12}), "max_tokens"),
        (json!({"max_tokens": "x"}), "max_tokens"),
        (json!({"stream": "maybe"}), "stream"),
        (
            json!({"stream_options": {"include_usage": true}}),
            "stream_options",
        ),
        (json!({"n": 0}), "n"),
    ] {
        refused(
            route(&svc.base, "chat", None, chat_with(extra)).await,
            "invalid_request",
            param,
            param,
        )
        .await;
    }
    expect(
        route(&svc.base, "embeddings", None, chat("x")).await,
        400,
        "unknown_api",
        "embeddings",
    )
    .await;
    expect(
        route(&svc.base, "chat", None, chat(&"long ".repeat(2_000))).await,
        413,
        "body_too_large",
        "4096",
    )
    .await;

    let m = svc.metrics().await;
    assert_metric(
        &m,
        "switchyard_route_bad_requests_total{code=\"invalid_request\"}",
        12.0,
    );
    assert_metric(
        &m,
        "switchyard_route_bad_requests_total{code=\"unknown_api\"}",
        1.0,
    );
    assert_metric(
        &m,
        "switchyard_route_bad_requests_total{code=\"body_too_large\"}",
        1.0,
    );
    // Vaguely lax values vLLM accepts are accepted, and n > 1 is served, undisaggregated.
    let ok = route(
        &svc.base,
        "chat",
        None,
        chat_with(json!({"max_tokens": "5", "stream": "yes", "n": 2})),
    )
    .await;
    assert_eq!(ok.status(), 200);

    // Unknown paths and methods answer JSON errors too.
    let resp = reqwest::get(format!("{}/v1/nope", svc.base)).await.unwrap();
    assert_eq!(resp.status(), 404);
    let resp = reqwest::get(format!("{}/v1/route", svc.base))
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    svc.stop().await;
}

/// The verdict vouches for a body only when the control plane's parse of it found no key only
/// the gateway may set (the filter then passes it on without screening it itself), however
/// the key is spelled in JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verdict_vouches_only_for_a_body_without_steering_keys() {
    let (_server, svc, nats) = service_with_nats(Settings::for_tests()).await;
    register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;
    let verdict = |body: String| {
        let base = svc.base.clone();
        async move {
            let response = route(&base, "chat", None, body).await;
            assert_eq!(response.status(), 200);
            response.json::<Verdict>().await.expect("a verdict")
        }
    };
    let clean = verdict(chat("hello")).await;
    assert!(clean.steering_free, "{clean:?}");
    for key in switchyard_protocol::openai::CLIENT_STEERING_KEYS {
        let mut body: serde_json::Value = serde_json::from_str(&chat("hello")).unwrap();
        body[key] = json!({"remote_host": "10.9.9.9"});
        let named = verdict(body.to_string()).await;
        assert!(!named.steering_free, "{key}: {named:?}");
    }
    // `\u005f` is `_`: the same key to any JSON parser.
    let escaped = r#"{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "kv\u005ftransfer_params": {}}"#;
    assert!(!verdict(escaped.to_string()).await.steering_free);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eds_serves_pool_membership_with_a_stable_version() {
    let (_server, svc, nats) = service_with_nats(Settings::for_tests()).await;
    let http = reqwest::Client::new();
    // Until ready, EDS answers 503 so that Envoy keeps the endpoints it has.
    let starting = http
        .post(format!("{}/v3/discovery:endpoints", svc.base))
        .json(&json!({"resource_names": ["switchyard_decode"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(starting.status(), 503);
    assert_eq!(
        starting.json::<serde_json::Value>().await.unwrap()["code"],
        "starting"
    );
    eventually(Duration::from_secs(5), "ready", || async {
        svc.get_json("/readyz").await["ready"] == true
    })
    .await;
    let poll = |version: &str| {
        let req = json!({"version_info": version, "node": {"id": "envoy"},
            "resource_names": ["switchyard_decode", "switchyard_prefill"],
            "type_url": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"});
        let fut = http
            .post(format!("{}/v3/discovery:endpoints", svc.base))
            .json(&req)
            .send();
        async move {
            fut.await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    let empty = poll("").await;
    assert_eq!(empty["resources"][0]["cluster_name"], "switchyard_decode");
    assert_eq!(empty["resources"][0]["endpoints"], json!([]));

    register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;
    register_worker(&svc, &nats, "prefill-0", WorkerRole::Prefill, 9100).await;
    let full = poll(empty["version_info"].as_str().unwrap()).await;
    assert_ne!(full["version_info"], empty["version_info"]);
    let decode_eps = &full["resources"][0]["endpoints"][0]["lb_endpoints"];
    assert_eq!(
        decode_eps[0]["endpoint"]["address"]["socket_address"]["port_value"],
        9001
    );
    let prefill_eps = &full["resources"][1]["endpoints"][0]["lb_endpoints"];
    assert_eq!(prefill_eps[0]["endpoint"]["hostname"], "prefill-0");
    // Same membership, same version.
    assert_eq!(poll("x").await["version_info"], full["version_info"]);
    // A request for another resource type is refused, not answered with endpoints that
    // would be read as that type's resources (camelCase, as protobuf JSON may write it).
    let clusters = http
        .post(format!("{}/v3/discovery:endpoints", svc.base))
        .json(&json!({"typeUrl": "type.googleapis.com/envoy.config.cluster.v3.Cluster"}))
        .send()
        .await
        .unwrap();
    assert_eq!(clusters.status(), 400);
    let refused: ApiError = clusters.json().await.unwrap();
    assert_eq!(refused.code, "unsupported_type");
    assert!(refused.message.contains("Cluster\""), "{refused:?}");
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_is_read_and_patched_with_field_named_errors() {
    let mut settings = Settings::for_tests();
    settings.conditional_disagg_config = Some(r#"{"eff_isl_threshold": 1024}"#.into());
    let (_server, svc, _) = service_with_nats(settings).await;

    let config = svc.get_json("/v1/config").await;
    assert_eq!(
        config["eff_isl_threshold"], 1024,
        "start-up config applied: {config}"
    );
    assert_eq!(config["serving_mode"], "conditional");

    let resp = svc
        .put_config(&json!({"policy": "isl_or_load", "decode_busy_threshold": 0.9}))
        .await;
    assert_eq!(resp.status(), 200);
    let after: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(after["policy"], "isl_or_load");
    assert_eq!(
        after["eff_isl_threshold"], 1024,
        "absent fields keep their value"
    );
    assert_eq!(svc.get_json("/v1/config").await, after);

    for (body, field) in [
        (
            json!({"eff_isl_ratio_threshold": 1.5}),
            "eff_isl_ratio_threshold",
        ),
        (json!({"eff_isl_threshold": "big"}), "eff_isl_threshold"),
        (json!({"no_such_knob": 1}), "no_such_knob"),
        (
            json!({"selection": {"temperature": -1.0}}),
            "selection.temperature",
        ),
        (json!({"policy": "coin_flip"}), "policy"),
    ] {
        let resp = svc.put_config(&body).await;
        assert_eq!(resp.status(), 400, "{body}");
        let err: ApiError = resp.json().await.unwrap();
        assert_eq!(err.code, "invalid_config");
        assert!(err.message.contains(field), "{err:?} should name {field}");
    }
    let resp = svc.put_config_raw("{oops".into()).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.json::<ApiError>().await.unwrap().code, "invalid_json");
    assert_eq!(
        svc.get_json("/v1/config").await,
        after,
        "rejected patches change nothing"
    );

    let m = svc.metrics().await;
    assert_metric(
        &m,
        "switchyard_route_bad_requests_total{code=\"invalid_config\"}",
        5.0,
    );
    svc.stop().await;
}

/// `If-Match` on `PUT /v1/config`: two operators editing the config do not silently undo
/// each other's change. Without `--replica-id` the version counts this process's changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_change_on_a_stale_version_is_refused_with_412() {
    let (_server, svc, _) = service_with_nats(Settings::for_tests()).await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/config", svc.admin_base);
    let put = |patch: serde_json::Value, if_match: Option<&str>| {
        let mut request = http.put(&url).bearer_auth(TEST_ADMIN_TOKEN).json(&patch);
        if let Some(tag) = if_match {
            request = request.header("if-match", tag);
        }
        request.send()
    };
    let etag = |resp: &reqwest::Response| {
        resp.headers()
            .get("etag")
            .map(|v| v.to_str().unwrap().to_string())
    };
    let got = http
        .get(&url)
        .bearer_auth(TEST_ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(etag(&got).as_deref(), Some("\"0\""));

    // Both read version 0; the first change lands and makes it 1.
    let first = put(json!({"eff_isl_threshold": 111}), Some("\"0\""))
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(etag(&first).as_deref(), Some("\"1\""));
    // The second, made on version 0, is refused: nothing changes, the current tag is given.
    let second = put(json!({"eff_isl_threshold": 222}), Some("\"0\""))
        .await
        .unwrap();
    assert_eq!(second.status(), 412);
    assert_eq!(etag(&second).as_deref(), Some("\"1\""));
    let err: ApiError = second.json().await.unwrap();
    assert_eq!(err.code, "config_version_mismatch");
    assert!(err.message.contains("version 1"), "{err:?}");
    assert_eq!(svc.get_json("/v1/config").await["eff_isl_threshold"], 111);
    // A weak tag never matches; a list with the current one does; so does `*`, and no header.
    let weak = put(json!({"eff_isl_threshold": 333}), Some("W/\"1\""))
        .await
        .unwrap();
    assert_eq!(weak.status(), 412);
    let listed = put(json!({"eff_isl_threshold": 444}), Some("\"0\", \"1\""))
        .await
        .unwrap();
    assert_eq!(
        (listed.status().as_u16(), etag(&listed)),
        (200, Some("\"2\"".into()))
    );
    let any = put(json!({"eff_isl_threshold": 555}), Some("*"))
        .await
        .unwrap();
    assert_eq!(
        (any.status().as_u16(), etag(&any)),
        (200, Some("\"3\"".into()))
    );
    let plain = put(json!({"eff_isl_threshold": 666}), None).await.unwrap();
    assert_eq!(
        (plain.status().as_u16(), etag(&plain)),
        (200, Some("\"4\"".into()))
    );
    // A refused change does not count up the version.
    let invalid = put(json!({"eff_isl_threshold": -1}), Some("\"4\""))
        .await
        .unwrap();
    assert_eq!(invalid.status(), 400);
    // Nor does a change that changes nothing (it did, and another operator's `If-Match` on
    // the version they had read then failed for a config that had not moved).
    assert_eq!(
        etag(&put(json!({}), None).await.unwrap()).as_deref(),
        Some("\"4\"")
    );
    let same = put(json!({"eff_isl_threshold": 666}), Some("\"4\""))
        .await
        .unwrap();
    assert_eq!(
        (same.status().as_u16(), etag(&same)),
        (200, Some("\"4\"".into()))
    );
    assert_eq!(
        etag(&put(json!({"eff_isl_threshold": 777}), None).await.unwrap()).as_deref(),
        Some("\"5\"")
    );

    let m = svc.metrics().await;
    assert_metric(
        &m,
        "switchyard_route_bad_requests_total{code=\"config_version_mismatch\"}",
        2.0,
    );
    assert_metric(&m, "switchyard_config_version", 5.0);
    svc.stop().await;
}

/// Every endpoint of both listeners answers a method it does not serve with 405 and an
/// `Allow` header naming exactly the methods it does serve (RFC 9110 requires the header), and
/// serves every method it names: the table behind the header cannot drift from the routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_is_told_which_methods_the_endpoint_serves() {
    use switchyard_control_plane::api::{ADMIN_ENDPOINTS, ROUTE_ENDPOINTS};
    use switchyard_support::http_server::method_probes;
    let (_server, svc, _) = service_with_nats(Settings::for_tests()).await;
    let http = reqwest::Client::new();
    for (base, endpoints) in [
        (&svc.base, ROUTE_ENDPOINTS),
        (&svc.admin_base, ADMIN_ENDPOINTS),
    ] {
        for probe in method_probes(endpoints) {
            let resp = http
                .request(
                    probe.method.parse().unwrap(),
                    format!("{base}{}", probe.path),
                )
                .header("authorization", format!("Bearer {TEST_ADMIN_TOKEN}"))
                .body("{}")
                .send()
                .await
                .unwrap();
            let allow = resp.headers().get("allow").and_then(|v| v.to_str().ok());
            probe
                .check(resp.status().as_u16(), allow)
                .unwrap_or_else(|e| panic!("{base}: {e}"));
        }
    }
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_needs_its_token_and_has_its_own_listener() {
    let (_server, svc, _) = service_with_nats(Settings::for_tests()).await;
    let http = reqwest::Client::new();
    let before = svc.get_json("/v1/config").await;
    let patch = json!({"eff_isl_threshold": 7});

    // No token: 401 asking for a bearer token.
    let resp = http
        .put(format!("{}/v1/config", svc.admin_base))
        .json(&patch)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    assert_eq!(resp.json::<ApiError>().await.unwrap().code, "missing_token");

    // A wrong token (shorter, longer, same length, another scheme): 403 on every admin
    // endpoint that changes or dumps state.
    let same_length: String = TEST_ADMIN_TOKEN.chars().rev().collect();
    let wrong = [
        format!("Bearer {}", &TEST_ADMIN_TOKEN[1..]),
        format!("Bearer {TEST_ADMIN_TOKEN}0"),
        format!("Bearer {same_length}"),
        format!("Basic {TEST_ADMIN_TOKEN}"),
    ];
    for authorization in &wrong {
        for request in [
            http.put(format!("{}/v1/config", svc.admin_base))
                .json(&patch),
            http.get(format!("{}/v1/config", svc.admin_base)),
            http.get(format!("{}/v1/workers", svc.admin_base)),
        ] {
            let resp = request
                .header("authorization", authorization)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 403, "{authorization}");
            assert_eq!(resp.json::<ApiError>().await.unwrap().code, "wrong_token");
        }
    }
    assert_eq!(
        svc.get_json("/v1/config").await,
        before,
        "refused patches change nothing"
    );

    // The route listener does not serve the admin endpoints, with or without the token; it
    // serves metrics and health, as the admin listener does.
    for request in [
        http.put(format!("{}/v1/config", svc.base)).json(&patch),
        http.get(format!("{}/v1/workers", svc.base)),
    ] {
        let resp = request.bearer_auth(TEST_ADMIN_TOKEN).send().await.unwrap();
        assert_eq!(resp.status(), 404);
        assert_eq!(
            resp.json::<ApiError>().await.unwrap().code,
            "admin_listener"
        );
    }
    // Nor inference: a client sent here instead of to the gateway is told where to go.
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let resp = http
            .post(format!("{}{path}", svc.base))
            .json(&serde_json::json!({"model": "m", "prompt": "hi"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404, "{path}");
        let error = resp.json::<ApiError>().await.unwrap();
        assert_eq!(error.code, "not_the_gateway", "{path}");
        assert!(
            error.message.contains("Envoy's listener"),
            "{}",
            error.message
        );
    }
    for base in [&svc.base, &svc.admin_base] {
        for path in ["/healthz", "/metrics"] {
            let resp = http.get(format!("{base}{path}")).send().await.unwrap();
            assert_eq!(resp.status(), 200, "{base}{path}");
        }
        // Probes that check with HEAD get the same answer, without a body.
        let resp = http.head(format!("{base}/healthz")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "HEAD {base}/healthz");
        let resp = http.head(format!("{base}/readyz")).send().await.unwrap();
        assert!(
            [200, 503].contains(&resp.status().as_u16()),
            "HEAD {base}/readyz: {}",
            resp.status()
        );
        assert!(resp.bytes().await.unwrap().is_empty(), "HEAD has no body");
    }
    // The route API itself needs no token (400: the body is not a request).
    let resp = route(&svc.base, "chat", None, "{}").await;
    assert_eq!(resp.status(), 400);

    let m = svc.metrics().await;
    assert_metric(
        &m,
        "switchyard_admin_refusals_total{reason=\"missing_token\"}",
        1.0,
    );
    assert_metric(
        &m,
        "switchyard_admin_refusals_total{reason=\"wrong_token\"}",
        12.0,
    );
    assert_metric(
        &m,
        "switchyard_admin_refusals_total{reason=\"admin_token_not_configured\"}",
        0.0,
    );
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_admin_token_the_admin_api_is_closed_and_a_short_one_stops_start_up() {
    let server = NatsServer::start();
    let svc = Service::start_as_configured(Settings::for_tests(), tokenizer(), &server.url).await;
    let http = reqwest::Client::new();
    let resp = http
        .get(format!("{}/v1/config", svc.admin_base))
        .bearer_auth(TEST_ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    assert_eq!(
        resp.json::<ApiError>().await.unwrap().code,
        "admin_token_not_configured"
    );
    assert_metric(
        &svc.metrics().await,
        "switchyard_admin_refusals_total{reason=\"admin_token_not_configured\"}",
        1.0,
    );
    svc.stop().await;

    let mut settings = Settings::for_tests();
    settings.admin_token_env = Some(Redacted("short".into()));
    let err = switchyard_control_plane::service::run_with_tokenizer(
        settings,
        tokenizer(),
        loopback_listeners().await,
        client(&server.url).await,
        Box::pin(async {}),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("SWITCHYARD_ADMIN_TOKEN"), "{err}");
    assert!(err.to_string().contains("at least 16"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_health_and_metrics_endpoints_answer_and_refuse_bad_input() {
    let (_server, svc, _) = service_with_nats(Settings::for_tests()).await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/lifecycle", svc.base);

    let ok = json!({"v": 1, "events": [
        {"event": "first_token", "request_id": "r-1"},
        {"event": "done", "request_id": "r-1", "ok": true}
    ]});
    let resp = http.post(&url).json(&ok).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap()["accepted"],
        2
    );

    for (v, words) in [(9, "newer than this build reads (1)"), (0, "not a version")] {
        let resp = http
            .post(&url)
            .json(&json!({"v": v, "events": [{"event": "first_token", "request_id": "r-3"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "v {v}");
        let err: ApiError = resp.json().await.unwrap();
        assert_eq!(err.code, "unsupported_version");
        assert!(err.message.contains(words), "{err:?}");
    }
    // A newer filter's event kind is skipped and counted, and the `done` batched with it
    // still applies: refused, the filter dropped the whole batch, and every request in it
    // stayed counted in flight on its worker until the workers' load reports showed it gone.
    let resp = http
        .post(&url)
        .json(&json!({"events": [
            {"event": "teleported", "request_id": "r-4", "to": "mars"},
            {"event": "done", "request_id": "r-4", "ok": true, "new_field": 1}
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap(),
        json!({"accepted": 1, "ignored": 1})
    );
    let resp = http
        .post(&url)
        .json(&json!({"events": [{"event": "teleported", "request_id": "r-5"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap(),
        json!({"accepted": 0, "ignored": 1})
    );
    let metrics = svc.metrics().await;
    assert_metric(
        &metrics,
        "switchyard_lifecycle_events_total{event=\"unknown\"}",
        2.0,
    );
    assert_metric(
        &metrics,
        "switchyard_lifecycle_events_total{event=\"done\"}",
        2.0,
    );
    // A known kind without what it needs is still refused, naming the field.
    let resp = http
        .post(&url)
        .json(&json!({"events": [{"event": "done", "ok": true}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let err: ApiError = resp.json().await.unwrap();
    assert_eq!(err.code, "invalid_json");
    assert!(err.message.contains("request_id"), "{err:?}");
    // A valid batch written as an array is refused, not read field by field.
    let resp = http
        .post(&url)
        .json(&json!([1, [{"event": "first_token", "request_id": "r-2"}]]))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let err: ApiError = resp.json().await.unwrap();
    assert_eq!(
        (err.code.as_str(), err.message.as_str()),
        ("invalid_json", "expected a JSON object, found an array")
    );

    // An id the route API refuses matches no verdict: a 500 KB one was kept for a minute.
    for bad in ["Z".repeat(129), "has space".into(), String::new()] {
        let resp = http
            .post(&url)
            .json(&json!({"v": 1, "events": [
                {"event": "first_token", "request_id": "fine"},
                {"event": "done", "request_id": bad, "ok": false, "failed_open": true}
            ]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{bad:?}");
        let err: ApiError = resp.json().await.unwrap();
        assert_eq!(err.code, "invalid_request_id", "{bad:?}");
        assert!(err.message.starts_with("events[1].request_id"), "{err:?}");
    }

    // The service's NATS client connects in the background; health reports it once it has.
    eventually(
        std::time::Duration::from_secs(10),
        "healthz says nats connected",
        || async { svc.get_json("/healthz").await == json!({"status": "ok", "nats": "connected"}) },
    )
    .await;
    let resp = reqwest::get(format!("{}/metrics", svc.base)).await.unwrap();
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = resp.text().await.unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert_metric(&text, "switchyard_nats_connected", 1.0);
    // Every verdict reason is there from the start.
    for reason in Reason::ALL {
        assert!(
            text.contains(&format!("reason=\"{reason}\"")),
            "{reason} missing: {text}"
        );
    }
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_an_in_flight_route_request_finish() {
    let (_server, svc, nats) = service_with_nats(Settings::for_tests()).await;
    register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;

    // Send half the body, start shutting down, then send the rest.
    let body = chat("a request that is still uploading when shutdown starts");
    let (first, rest) = body.split_at(body.len() / 2);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(2);
    tx.send(Ok(first.to_string())).await.unwrap();
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let base = svc.base.clone();
    let pending = tokio::spawn(async move {
        route(
            &base,
            "chat",
            Some("draining"),
            reqwest::Body::wrap_stream(stream),
        )
        .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let base = svc.base.clone();
    let stopping = tokio::spawn(svc.stop());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    tx.send(Ok(rest.to_string())).await.unwrap();
    drop(tx);

    let resp = pending.await.unwrap();
    assert_eq!(resp.status(), 200, "the in-flight request was served");
    stopping.await.unwrap();
    assert!(
        reqwest::get(format!("{base}/healthz")).await.is_err(),
        "no longer listening"
    );
}

/// A stopping replica first says it is not ready and serves on for `--shutdown-delay-ms`, so
/// Envoy's health check takes it out of rotation before it stops accepting route calls (a
/// rolling restart failed a few requests open when it stopped at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_says_not_ready_and_serves_on_for_the_delay() {
    let mut settings = Settings::for_tests();
    settings.shutdown_delay_ms = Some(1_500);
    let (_server, svc, nats) = service_with_nats(settings).await;
    register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;
    eventually(Duration::from_secs(5), "ready", || async {
        svc.get_json("/readyz").await["ready"] == true
    })
    .await;
    let (base, admin_base) = (svc.base.clone(), svc.admin_base.clone());
    let stopping = tokio::spawn(svc.stop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ready = reqwest::get(format!("{admin_base}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 503);
    let body: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(body, json!({"ready": false, "waiting_for": "stopping"}));
    let metrics = reqwest::get(format!("{admin_base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.lines().any(|l| l == "switchyard_ready 0"),
        "the gauge says it too: {:?}",
        metrics
            .lines()
            .filter(|l| l.contains("ready"))
            .collect::<Vec<_>>()
    );
    let served = route(
        &base,
        "chat",
        Some("during-the-delay"),
        chat("still served"),
    )
    .await;
    assert_eq!(served.status(), 200, "route calls are still served");
    stopping.await.unwrap();
    assert!(
        reqwest::get(format!("{base}/healthz")).await.is_err(),
        "no longer listening"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_to_start_on_bad_config_or_a_missing_tokenizer() {
    use switchyard_control_plane::service::{run, RunError};
    let nats = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(format!("nats://127.0.0.1:{}", free_port()))
        .await
        .unwrap();

    let mut settings = Settings::for_tests();
    settings.model_dir = Some(std::path::PathBuf::from("/nonexistent/model"));
    let err = run(
        settings,
        loopback_listeners().await,
        nats.clone(),
        Box::pin(std::future::pending()),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, RunError::Tokenizer(_)), "{err}");
    assert!(err.to_string().contains("/nonexistent/model"), "{err}");

    let mut settings = Settings::for_tests();
    settings.model_dir = Some(model_dir());
    settings.conditional_disagg_config = Some(r#"{"policy": "coin_flip"}"#.into());
    let err = run(
        settings,
        loopback_listeners().await,
        nats,
        Box::pin(std::future::pending()),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, RunError::Config(_)), "{err}");
    assert!(err.to_string().contains("policy"), "{err}");
}

/// `truncate_prompt_tokens` cuts the prompt as vLLM 0.32 cuts it (`vllm032_chat.json`'s
/// `truncated` cases): a prompt beyond the context is served once cut, and is routed on the
/// tokens the engine keeps, not refused or matched on tokens the engine never sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_cut_by_truncate_prompt_tokens_is_routed_on_what_the_engine_keeps() {
    let mut settings = Settings::for_tests();
    settings.max_model_len = Some(64);
    let (_server, svc, nats) = service_with_nats(settings).await;
    register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;
    let long_chat = |extra: serde_json::Value| {
        let mut body =
            json!({"messages": [{"role": "user", "content": "many words here ".repeat(40)}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body.to_string()
    };
    let ids: Vec<u32> = (1..=100).collect();
    for (api, body, isl) in [
        // -1: the context less the token the output needs.
        (
            "chat",
            long_chat(json!({"truncate_prompt_tokens": -1, "max_tokens": 1})),
            63,
        ),
        (
            "chat",
            long_chat(json!({"truncate_prompt_tokens": 20, "truncation_side": "right"})),
            20,
        ),
        (
            "completions",
            json!({"prompt": ids, "truncate_prompt_tokens": "10"}).to_string(),
            10,
        ),
        // Every prompt of a batch is held to the context once cut.
        (
            "completions",
            json!({"prompt": [ids, ids], "truncate_prompt_tokens": 10}).to_string(),
            10,
        ),
    ] {
        let routed = route(&svc.base, api, None, body.clone()).await;
        assert_eq!(routed.status(), 200, "{body}");
        let verdict: Verdict = routed.json().await.unwrap();
        assert_eq!(verdict.isl, isl, "{body}");
    }
    for (body, param) in [
        // -1 without max_tokens keeps the whole context: nothing is left to generate.
        (
            long_chat(json!({"truncate_prompt_tokens": -1})),
            "input_tokens",
        ),
        (
            long_chat(json!({"truncate_prompt_tokens": 65})),
            "truncate_prompt_tokens",
        ),
        (long_chat(json!({"truncate_prompt_tokens": 0})), "prompt"),
        (
            long_chat(json!({"truncate_prompt_tokens": 5, "truncation_side": "middle"})),
            "truncation_side",
        ),
    ] {
        let refused = route(&svc.base, "chat", None, body.clone()).await;
        assert_eq!(refused.status(), 400, "{body}");
        let answer: serde_json::Value = refused.json().await.unwrap();
        assert_eq!(answer["error"]["param"], param, "{body}: {answer}");
    }
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_beyond_the_context_are_refused_before_routing() {
    let mut settings = Settings::for_tests();
    settings.max_model_len = Some(64);
    let (_server, svc, nats) = service_with_nats(settings).await;
    register_worker(&svc, &nats, "decode-0", WorkerRole::Decode, 9001).await;
    let long = route(
        &svc.base,
        "chat",
        None,
        chat(&"many words here ".repeat(40)),
    )
    .await;
    assert_eq!(long.status(), 400);
    assert_eq!(
        long.headers()
            .get(REJECT_HEADER)
            .and_then(|v| v.to_str().ok()),
        Some("prompt_too_long")
    );
    let body: serde_json::Value = long.json().await.unwrap();
    assert_eq!(body["error"]["param"], "input_tokens", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("64 tokens"),
        "{body}"
    );
    let too_many = route(
        &svc.base,
        "chat",
        None,
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 65}).to_string(),
    )
    .await;
    assert_eq!(too_many.status(), 400);
    assert_eq!(
        route(&svc.base, "chat", None, chat("short")).await.status(),
        200
    );
    // As vLLM 0.32: an empty prompt has nothing to generate from, and one that fills the
    // context leaves no room for a generated token.
    for empty in [json!({"prompt": ""}), json!({"prompt": [""]})] {
        let refused = route(&svc.base, "completions", None, empty.to_string()).await;
        assert_eq!(refused.status(), 400, "{empty}");
        assert_eq!(
            refused
                .headers()
                .get(REJECT_HEADER)
                .and_then(|v| v.to_str().ok()),
            Some("invalid_request"),
            "{empty}"
        );
        let body: serde_json::Value = refused.json().await.unwrap();
        assert!(
            body["error"]["message"].as_str().unwrap().contains("empty"),
            "{body}"
        );
    }
    let full: Vec<u32> = (1..=64).collect();
    let filled = route(
        &svc.base,
        "completions",
        None,
        json!({"prompt": full}).to_string(),
    )
    .await;
    assert_eq!(filled.status(), 400);
    let almost: Vec<u32> = (1..=63).collect();
    assert_eq!(
        route(
            &svc.base,
            "completions",
            None,
            json!({"prompt": almost}).to_string()
        )
        .await
        .status(),
        200
    );
    // A batch is served prompt by prompt: every one must fit, not just the first that
    // routes it; and every token id must be in the vocabulary.
    let vocab = 151_668;
    for (batch, param, code) in [
        (json!(["short", ""]), "prompt[1]", "invalid_request"),
        (json!([[1, 2], []]), "prompt[1]", "invalid_request"),
        (json!([[1, 2], full]), "prompt[1]", "prompt_too_long"),
        (
            json!([[1, 2], [vocab + 1000]]),
            "prompt[1][0]",
            "invalid_request",
        ),
        (json!([1, vocab + 1000]), "prompt[1]", "invalid_request"),
    ] {
        let refused = route(
            &svc.base,
            "completions",
            None,
            json!({ "prompt": batch }).to_string(),
        )
        .await;
        assert_eq!(refused.status(), 400, "{batch}");
        assert_eq!(
            refused
                .headers()
                .get(REJECT_HEADER)
                .and_then(|v| v.to_str().ok()),
            Some(code),
            "{batch}"
        );
        let body: serde_json::Value = refused.json().await.unwrap();
        assert_eq!(body["error"]["param"], param, "{batch}: {body}");
    }
    let m = svc.metrics().await;
    assert_metric(
        &m,
        "switchyard_route_bad_requests_total{code=\"prompt_too_long\"}",
        3.0,
    );
    // Refused requests are not routed: nothing is predicted or tracked for them.
    let decisions: f64 = m
        .lines()
        .filter(|l| l.starts_with("switchyard_route_decisions_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(
        decisions, 2.0,
        "the short chat and the 63-token prompt: {m}"
    );
    svc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_pages_what_if_module_is_served_without_the_token_or_said_unavailable() {
    let dir = TempDir::new("whatif").unwrap();
    let files = [
        (
            "switchyard_whatif.js",
            "text/javascript; charset=utf-8",
            b"export default async function () {}".to_vec(),
        ),
        (
            "switchyard_whatif_bg.wasm",
            "application/wasm",
            b"\0asm\x01\0\0\0".to_vec(),
        ),
    ];
    for (name, _, body) in &files {
        std::fs::write(dir.path().join(name), body).unwrap();
    }
    let mut settings = Settings::for_tests();
    settings.whatif_dir = Some(dir.path().to_path_buf());
    let (_server, svc, _) = service_with_nats(settings).await;
    let http = reqwest::Client::new();
    let get = |base: &str, name: &str| http.get(format!("{base}/whatif/{name}")).send();

    // Served without the token, as the browser needs them: JavaScript for a module script,
    // application/wasm for streaming compilation, revalidated on every load.
    for (name, content_type, body) in &files {
        let resp = get(&svc.admin_base, name).await.unwrap();
        assert_eq!(resp.status(), 200, "{name}");
        assert_eq!(resp.headers()["content-type"], *content_type);
        assert_eq!(resp.headers()["cache-control"], "no-cache");
        assert_eq!(resp.bytes().await.unwrap().as_ref(), body.as_slice());
    }
    // Only those two names, and only on the admin listener.
    for (base, name) in [
        (&svc.admin_base, "index.html"),
        (&svc.admin_base, "..%2Fsecret"),
        (&svc.base, "switchyard_whatif.js"),
    ] {
        let resp = get(base, name).await.unwrap();
        assert_eq!(resp.status(), 404, "{base} {name}");
        assert_eq!(resp.json::<ApiError>().await.unwrap().code, "not_found");
    }
    // Unknown paths and wrong methods are counted like every refused request.
    let wrong_method = http
        .get(format!("{}/v1/route", svc.base))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), 405);
    let m = svc.metrics().await;
    assert_metric(
        &m,
        "switchyard_route_bad_requests_total{code=\"not_found\"}",
        3.0,
    );
    assert_metric(
        &m,
        "switchyard_route_bad_requests_total{code=\"method_not_allowed\"}",
        1.0,
    );
    // A file gone: unavailable, counted, and the answer names no server path.
    std::fs::remove_file(dir.path().join("switchyard_whatif_bg.wasm")).unwrap();
    let resp = get(&svc.admin_base, "switchyard_whatif_bg.wasm")
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let err: ApiError = resp.json().await.unwrap();
    assert_eq!(err.code, "whatif_unavailable");
    assert!(err.message.contains("scripts/build-whatif.sh"), "{err:?}");
    assert!(
        !err.message.contains(&*dir.path().to_string_lossy()),
        "{err:?}"
    );
    assert_metric(
        &svc.metrics().await,
        "switchyard_route_bad_requests_total{code=\"whatif_unavailable\"}",
        1.0,
    );

    // Without --whatif-dir the page is told how to get one.
    let (_server, svc, _) = service_with_nats(Settings::for_tests()).await;
    let resp = get(&svc.admin_base, "switchyard_whatif.js").await.unwrap();
    assert_eq!(resp.status(), 404);
    let err: ApiError = resp.json().await.unwrap();
    assert_eq!(err.code, "whatif_unavailable");
    assert!(err.message.contains("--whatif-dir"), "{err:?}");
}
