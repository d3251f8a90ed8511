//! Root context: parses the configuration once, defines the stats, makes request contexts.

use std::rc::Rc;

use log::{error, info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, MetricType};

use crate::config::Config;
use crate::http::SwitchyardRequest;
use crate::metrics::{self, StatIds};
use crate::request::headers_to_strip;
use crate::verdict::FailOpenReason;

/// What every request context of this VM shares (read-only).
#[derive(Debug)]
pub(crate) struct Shared {
    /// The validated configuration.
    pub(crate) config: Config,
    /// Envoy metric ids.
    pub(crate) stats: StatIds,
}

/// The plugin's root context.
pub(crate) struct SwitchyardRoot {
    context_id: u32,
    /// `None` until `on_configure` succeeds; no request context is made before that.
    shared: Option<Rc<Shared>>,
}

impl SwitchyardRoot {
    pub(crate) fn new(context_id: u32) -> Self {
        SwitchyardRoot {
            context_id,
            shared: None,
        }
    }
}

/// Defines a counter. `define_metric` is idempotent per name in Envoy, so a reconfigure
/// gets the same ids; a failure leaves id 0, whose increments are ignored.
fn define_counter(name: &str) -> u32 {
    match hostcalls::define_metric(MetricType::Counter, name) {
        Ok(id) => id,
        Err(status) => {
            warn!("cannot define metric {name}: {status:?}");
            0
        }
    }
}

fn define_stats() -> StatIds {
    StatIds {
        fail_open_total: define_counter(metrics::FAIL_OPEN_TOTAL),
        fail_open: FailOpenReason::STAT_KEYS
            .iter()
            .map(|key| define_counter(&metrics::fail_open_stat_name(key)))
            .collect(),
        routed: metrics::MODES
            .iter()
            .map(|m| define_counter(&metrics::routed_stat_name(*m)))
            .collect(),
        route_calls_total: define_counter(metrics::ROUTE_CALLS_TOTAL),
        stripped_headers_total: define_counter(metrics::STRIPPED_HEADERS_TOTAL),
    }
}

impl Context for SwitchyardRoot {}

impl RootContext for SwitchyardRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let raw = self.get_plugin_configuration();
        match Config::parse(raw.as_deref()) {
            Ok(config) => {
                info!(
                    "#{} switchyard filter configured: cluster={} timeout={}ms",
                    self.context_id, config.control_plane_cluster, config.route_timeout_ms
                );
                self.shared = Some(Rc::new(Shared {
                    config,
                    stats: define_stats(),
                }));
                true
            }
            Err(e) => {
                error!("#{} {e}", self.context_id);
                false
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Returning `None` would make the SDK panic (abort the VM). Envoy refuses a plugin
        // whose `on_configure` failed, so this is a guard, not a path: pass requests through,
        // still without client routing headers.
        let Some(shared) = self.shared.clone() else {
            return Some(Box::new(Unconfigured));
        };
        Some(Box::new(SwitchyardRequest::new(context_id, shared)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Request context used only if no configuration was ever accepted: strips and passes.
struct Unconfigured;

impl Context for Unconfigured {}

impl HttpContext for Unconfigured {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let headers = self.get_http_request_headers();
        for name in headers_to_strip(headers.iter().map(|(name, _)| name.as_str())) {
            self.set_http_request_header(&name, None);
        }
        Action::Continue
    }
}
