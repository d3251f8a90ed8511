//! Header reads that cannot panic on what a client or an upstream sends.
//!
//! The proxy-wasm SDK's string getters (`get_http_request_header`, `..._headers`, and the
//! response and call-response ones) unwrap a UTF-8 conversion of every value. Header values
//! are bytes: one client header with a Latin-1 byte (`User-Agent: caf\xe9`) panicked the VM,
//! and with it the filter on that Envoy worker thread for every later request. The getters
//! here read bytes; a value that is not UTF-8 reads as absent, which every caller already
//! handles (a request id is then minted, a routed path is not recognised). Names are safe as
//! strings: Envoy's codecs refuse a header name outside HTTP's token characters.
//!
//! `.clippy.toml` forbids the SDK's string getters, so these are the only way to read headers.

use proxy_wasm::traits::{Context, HttpContext};

fn utf8(value: Option<Vec<u8>>) -> Option<String> {
    value.and_then(|bytes| String::from_utf8(bytes).ok())
}

/// Headers of a dispatched call's answer (the control plane's, a prefill worker's).
pub(crate) trait CallHeaders: Context {
    /// One header of the answer to the call being handled; `None` if absent or not UTF-8.
    fn call_response_header(&self, name: &str) -> Option<String> {
        utf8(self.get_http_call_response_header_bytes(name))
    }
}

impl<T: Context + ?Sized> CallHeaders for T {}

/// Headers of the stream a filter context handles.
pub(crate) trait StreamHeaders: HttpContext {
    /// One request header; `None` if absent or not UTF-8.
    fn request_header(&self, name: &str) -> Option<String> {
        utf8(self.get_http_request_header_bytes(name))
    }

    /// Every request header whose value is UTF-8, in order (a value that is not cannot be
    /// given to a dispatched call, whose headers are strings).
    fn request_headers(&self) -> Vec<(String, String)> {
        self.get_http_request_headers_bytes()
            .into_iter()
            .filter_map(|(name, value)| String::from_utf8(value).ok().map(|value| (name, value)))
            .collect()
    }

    /// The names of every request header, whatever their values.
    fn request_header_names(&self) -> Vec<String> {
        self.get_http_request_headers_bytes()
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    /// One response header; `None` if absent or not UTF-8.
    fn response_header(&self, name: &str) -> Option<String> {
        utf8(self.get_http_response_header_bytes(name))
    }
}

impl<T: HttpContext + ?Sized> StreamHeaders for T {}
