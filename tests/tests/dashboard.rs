//! The Grafana dashboard (`deploy/grafana/switchyard.json`) against what a running stack
//! exports: every metric a panel queries is one the control plane registers (its `/metrics`
//! leaves out a family until a first series exists, so the registered list is checked too)
//! or one Envoy's `/stats/prometheus` shows (where the filter's stats are), so no panel stays
//! empty because of a misspelt or removed metric. The dashboard's structure is checked too: unique
//! panel ids, every query panel on the datasource variable, inside the 24-column grid.

use std::collections::BTreeSet;

use serde_json::Value;
use switchyard_e2e::probe::known_workers;
use switchyard_e2e::{chat_body, client, get_text, post_observed, start_stack};
use switchyard_stack::StackBuilder;

const DASHBOARD: &str = include_str!("../../deploy/grafana/switchyard.json");

/// The sample names of a Prometheus text scrape.
fn sample_names(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            (end > 0).then(|| line[..end].to_string())
        })
        .collect()
}

/// The metric names a PromQL expression uses (the project's all start with `switchyard_`).
fn queried_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("switchyard_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// Every query of every panel: (panel title, expression).
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            found.push((
                panel["title"].as_str().unwrap_or("?").to_string(),
                target["expr"].as_str().unwrap_or("").to_string(),
            ));
        }
    }
    found
}

/// The (panel, metric) pairs whose metric `exported` does not have.
fn missing(dashboard: &Value, exported: &BTreeSet<String>) -> Vec<(String, String)> {
    queries(dashboard)
        .into_iter()
        .flat_map(|(title, expr)| {
            queried_names(&expr)
                .into_iter()
                .filter(|name| !exported.contains(name))
                .map(move |name| (title.clone(), name))
        })
        .collect()
}

#[test]
fn the_dashboard_is_a_well_formed_grafana_dashboard() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "switchyard");
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating");
    assert!(
        variables
            .iter()
            .any(|v| v["name"] == "datasource" && v["type"] == "datasource"),
        "a datasource variable, so the dashboard imports into any Grafana"
    );
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut query_panels = 0;
    for panel in panels {
        let title = panel["title"].as_str().expect("every panel has a title");
        assert!(
            ids.insert(panel["id"].as_u64().expect("id")),
            "duplicate id: {title}"
        );
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(x + w <= 24, "{title} leaves the 24-column grid");
        if panel["type"] == "row" {
            continue;
        }
        query_panels += 1;
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} queries nothing");
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or("");
            assert!(
                !queried_names(expr).is_empty(),
                "{title}: {expr:?} uses no Switchyard metric"
            );
        }
    }
    assert!(query_panels >= 20, "{query_panels} panels");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_a_panel_queries_is_exported_by_the_stack() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let stack = start_stack(StackBuilder::new().decode_workers(1).prefill_workers(1)).await;
    let http = client();
    known_workers(&stack, &http)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // One request, so the verdict and latency series have samples too.
    let response = post_observed(
        &http,
        &format!("{}/v1/chat/completions", stack.gateway_url()),
        &chat_body("Which metrics does the dashboard chart?", 4, true),
        &[],
        std::time::Duration::from_secs(60),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.status, 200);

    let control_plane = get_text(&http, &format!("{}/metrics", stack.control_plane_url()))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let envoy = get_text(&http, &format!("{}/stats/prometheus", stack.admin_url()))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let scraped = sample_names(&control_plane);
    let registered: BTreeSet<String> = switchyard_control_plane::metrics::Metrics::exported_names()
        .into_iter()
        .collect();
    let not_registered: Vec<_> = scraped
        .iter()
        .filter(|n| n.starts_with("switchyard_") && !registered.contains(*n))
        .collect();
    assert!(
        not_registered.is_empty(),
        "the registered list misses what the control plane serves: {not_registered:?}"
    );
    let mut exported = registered;
    exported.extend(sample_names(&envoy));

    let absent = missing(&dashboard, &exported);
    assert!(
        absent.is_empty(),
        "panels query metrics the stack does not export: {absent:?}"
    );
    // Both sources are charted: the check would catch a panel on either going stale.
    let queried: BTreeSet<String> = queries(&dashboard)
        .iter()
        .flat_map(|(_, expr)| queried_names(expr))
        .collect();
    assert!(queried.contains("switchyard_route_decisions_total"));
    assert!(queried.contains("switchyard_fail_open_timeout"));
    assert!(queried.contains("switchyard_worker_in_flight"));

    // And the check itself catches a misspelt metric.
    let mut broken = dashboard.clone();
    broken["panels"][1]["targets"][0]["expr"] =
        Value::from("sum(rate(switchyard_route_decision_total[5m]))");
    assert_eq!(
        missing(&broken, &exported),
        vec![(
            broken["panels"][1]["title"].as_str().unwrap().to_string(),
            "switchyard_route_decision_total".to_string()
        )]
    );
}
