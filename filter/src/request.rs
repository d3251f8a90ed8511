//! Request-side decisions: which requests are routed, which client headers are stripped, and
//! the request id shared by the route call and the upstream request.

pub use switchyard_protocol::route::{is_usable_request_id, MAX_REQUEST_ID_LEN};
use switchyard_protocol::route::{ApiKind, BYPASS_HEADER, DESTINATION_HEADER};

/// Prefix of every Switchyard header. Clients must not be able to forge them: they steer
/// routing (`x-switchyard-api`) or would be mistaken for the gateway's own annotations.
pub const SWITCHYARD_HEADER_PREFIX: &str = "x-switchyard-";

/// The API of a request the filter routes: `POST` to one of the OpenAI paths, as a worker
/// would see it ([`canonical_path`]). Everything else (GET /v1/models, health checks, ...)
/// is not routed; its body is still screened for steering keys.
pub fn routable_api(method: Option<&str>, path: Option<&str>) -> Option<ApiKind> {
    if !method?.eq_ignore_ascii_case("POST") {
        return None;
    }
    ApiKind::from_path(&canonical_path(path?)?)
}

/// The path a worker's router matches for `raw` (a `:path`, query included): query and
/// fragment dropped, percent-escapes decoded (Starlette routes on the decoded path, so
/// `/v1/chat/%63ompletions` reaches the chat handler), repeated slashes merged, `.` and `..`
/// segments resolved, and a trailing slash dropped (vLLM redirects `/v1/chat/completions/` to
/// the handler, warp matches it directly). A decoded `%`, `?` or `#` is escaped again, so the
/// result is itself a path that means the same (`/%23` stays `/%23`, not a fragment).
/// `None` for a path that is not one: no leading slash, a bad or NUL escape, non-UTF-8 after
/// decoding.
pub fn canonical_path(raw: &str) -> Option<String> {
    let path = raw.split(['?', '#']).next().unwrap_or("");
    if !path.starts_with('/') {
        return None;
    }
    let decoded = percent_decode(path)?;
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let escaped: Vec<String> = segments.iter().map(|s| escape_reserved(s)).collect();
    Some(format!("/{}", escaped.join("/")))
}

/// A decoded segment with the characters that would end or re-escape a path escaped again.
fn escape_reserved(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for c in segment.chars() {
        match c {
            '%' => out.push_str("%25"),
            '?' => out.push_str("%3F"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
    }
    out
}

/// Decodes `%XX` escapes; `None` for a malformed escape, an escaped NUL, or invalid UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            let byte = u8::from_str_radix(hex, 16).ok()?;
            if byte == 0 {
                return None;
            }
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Whether a client request header must be removed before anything else sees it: the
/// override-host destination (else any client could pick any upstream, an SSRF-like hole),
/// every `x-switchyard-*` header, and `x-bypass-remote-prefill`, which the filter sets on a
/// handoff's decode leg (engines in Dynamo's style read it). Header names from Envoy are
/// lower-case already; compare case-insensitively anyway.
pub fn is_client_routing_header(name: &str) -> bool {
    name.eq_ignore_ascii_case(DESTINATION_HEADER)
        || name.eq_ignore_ascii_case(BYPASS_HEADER)
        || name
            .get(..SWITCHYARD_HEADER_PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(SWITCHYARD_HEADER_PREFIX))
}

/// Client request headers the prefill leg does not carry: the ones the filter sets itself
/// (method, path, authority, content type, request id, destination), the body's framing
/// (the leg has its own body), hop-by-hop headers, and `accept-encoding` (the filter reads
/// the answer, so it must come uncompressed). Compared lower-case, as Envoy gives names.
const NOT_ON_THE_PREFILL_LEG: [&str; 13] = [
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "accept-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "host",
    "proxy-connection",
];

/// The client's request headers the prefill leg carries as the decode leg does: the
/// credentials (`authorization`, an API key header) and whatever else the client sent, so
/// that a prefill worker behind the same authentication as the decode workers accepts the
/// leg. Pseudo-headers, the filter's own headers, `x-switchyard-*` and the ones in
/// [`NOT_ON_THE_PREFILL_LEG`] are left out.
pub fn prefill_leg_headers<'a>(
    client: &'a [(String, String)],
    request_id_header: &str,
) -> Vec<(&'a str, &'a str)> {
    client
        .iter()
        .filter(|(name, _)| {
            let lower = name.to_ascii_lowercase();
            !lower.starts_with(':')
                && !is_client_routing_header(&lower)
                && lower != request_id_header
                && !NOT_ON_THE_PREFILL_LEG.contains(&lower.as_str())
        })
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect()
}

/// The names among `headers` to strip, deduplicated (a repeated header is removed once).
pub fn headers_to_strip<'a, I>(headers: I) -> Vec<String>
where
    I: IntoIterator<Item = &'a str>,
{
    let mut names: Vec<String> = Vec::new();
    for name in headers {
        if is_client_routing_header(name) && !names.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            names.push(name.to_ascii_lowercase());
        }
    }
    names
}

/// The request id to use: the client's (Envoy usually generates one before filters run) if
/// usable, else one made from the VM-unique context id and the time in nanoseconds. The bool
/// is true when the id is new and must be set on the upstream request too.
pub fn choose_request_id(
    existing: Option<&str>,
    context_id: u32,
    now_nanos: u128,
) -> (String, bool) {
    match existing {
        Some(id) if is_usable_request_id(id) => (id.to_string(), false),
        _ => (format!("switchyard-{now_nanos:x}-{context_id:x}"), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_leg_carries_the_clients_credentials_not_its_framing() {
        let client: Vec<(String, String)> = [
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("authorization", "Bearer sk-1"),
            ("openai-organization", "org"),
            ("content-type", "application/json"),
            ("content-length", "120"),
            ("accept-encoding", "gzip"),
            ("x-request-id", "r-1"),
            ("x-switchyard-route", "forged"),
            ("x-gateway-destination-endpoint", "10.0.0.1:1"),
            ("Connection", "keep-alive"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            prefill_leg_headers(&client, "x-request-id"),
            vec![
                ("authorization", "Bearer sk-1"),
                ("openai-organization", "org")
            ]
        );
    }

    #[test]
    fn only_posts_to_openai_paths_are_routed() {
        let chat = Some("/v1/chat/completions");
        assert_eq!(routable_api(Some("POST"), chat), Some(ApiKind::Chat));
        assert_eq!(
            routable_api(Some("post"), Some("/v1/completions?x=1")),
            Some(ApiKind::Completions)
        );
        assert_eq!(routable_api(Some("GET"), chat), None);
        assert_eq!(routable_api(Some("POST"), Some("/v1/models")), None);
        assert_eq!(routable_api(None, chat), None);
        assert_eq!(routable_api(Some("POST"), None), None);
    }

    #[test]
    fn every_spelling_a_worker_routes_to_an_api_is_routed() {
        for path in [
            "/v1/chat/completions/",
            "//v1//chat/completions",
            "/v1/chat/%63ompletions",
            "/v1/chat/completions?stream=1",
            "/v1/./chat/x/../completions",
            "/v1%2Fchat%2Fcompletions",
            "/v1/chat/completions#frag",
        ] {
            assert_eq!(
                routable_api(Some("POST"), Some(path)),
                Some(ApiKind::Chat),
                "{path}"
            );
        }
        assert_eq!(
            routable_api(Some("POST"), Some("/v1/completions/")),
            Some(ApiKind::Completions)
        );
        for path in [
            "/v1/chat/completion",
            "/v1/chat/completions%00",
            "/v1/%zz",
            "v1/completions",
            "/V1/completions",
        ] {
            assert_eq!(routable_api(Some("POST"), Some(path)), None, "{path}");
        }
        assert_eq!(
            canonical_path("/../../etc/passwd").as_deref(),
            Some("/etc/passwd")
        );
        assert_eq!(canonical_path("/").as_deref(), Some("/"));
        // A decoded `#`, `?` or `%` is data, not a fragment, query or escape: kept escaped,
        // so the canonical form is its own canonical form.
        assert_eq!(canonical_path("/%23?x").as_deref(), Some("/%23"));
        assert_eq!(
            canonical_path("/a%3Fb/%2525").as_deref(),
            Some("/a%3Fb/%2525")
        );
        assert_eq!(
            canonical_path(&canonical_path("/%23").unwrap()).as_deref(),
            Some("/%23")
        );
    }

    #[test]
    fn destination_and_switchyard_headers_are_stripped_others_kept() {
        let headers = [
            ":path",
            "x-gateway-destination-endpoint",
            "X-Switchyard-Api",
            "x-switchyard-route",
            "x-switchyard-api",
            "x-request-id",
            "x-switchyar",
            "content-type",
            "X-Bypass-Remote-Prefill",
        ];
        assert_eq!(
            headers_to_strip(headers),
            vec![
                "x-gateway-destination-endpoint",
                "x-switchyard-api",
                "x-switchyard-route",
                "x-bypass-remote-prefill",
            ]
        );
    }

    #[test]
    fn client_request_id_is_kept_when_usable_else_generated() {
        assert_eq!(
            choose_request_id(Some("abc-1"), 7, 99),
            ("abc-1".to_string(), false)
        );
        let (generated, new) = choose_request_id(None, 7, 0xff);
        assert!(new);
        assert_eq!(generated, "switchyard-ff-7");
        assert!(choose_request_id(Some("has space"), 1, 1).1);
        assert!(choose_request_id(Some(""), 1, 1).1);
        assert!(choose_request_id(Some(&"a".repeat(MAX_REQUEST_ID_LEN + 1)), 1, 1).1);
        // Two contexts at the same instant get different ids.
        assert_ne!(
            choose_request_id(None, 1, 5).0,
            choose_request_id(None, 2, 5).0
        );
    }
}
