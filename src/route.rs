//! Which route a request belongs to: the first whose host, method and path prefix all match, in
//! file order (as nginx `location` blocks are read by an operator, top to bottom).

use crate::config::Route;

#[derive(Debug, Clone)]
struct Matcher {
    host: Option<String>,
    methods: Option<Vec<String>>,
    path_prefix: String,
}

/// The compiled match rules of every route, in config order.
#[derive(Debug, Clone)]
pub struct RouteTable {
    matchers: Vec<Matcher>,
}

impl RouteTable {
    pub fn new(routes: &[Route]) -> RouteTable {
        let matchers = routes
            .iter()
            .map(|r| Matcher {
                host: r.host.clone(),
                methods: r.methods.clone(),
                path_prefix: r.path_prefix.clone(),
            })
            .collect();
        RouteTable { matchers }
    }

    /// The index of the first matching route for a canonical request (`canonical`): `host`
    /// lowercase without a port, `None` when the request named no host (only routes without a
    /// host rule can match it then). Paths match case-sensitively, as URIs do.
    pub fn find(&self, host: Option<&str>, method: &str, path: &str) -> Option<usize> {
        self.matchers.iter().position(|m| {
            m.host.as_deref().is_none_or(|want| host == Some(want))
                && m.methods
                    .as_ref()
                    .is_none_or(|ms| ms.iter().any(|x| x == method))
                && path.starts_with(m.path_prefix.as_str())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn table() -> RouteTable {
        let yaml = r#"
listen: "127.0.0.1:1"
routes:
  - { name: login, match: { path_prefix: "/api/login", methods: [POST] }, upstream: "127.0.0.1:2" }
  - { name: api, match: { path_prefix: "/api/", host: "API.example.com" }, upstream: "127.0.0.1:2" }
  - { name: rest, upstream: "127.0.0.1:2" }
"#;
        RouteTable::new(&Config::parse("t.yaml", yaml).unwrap().routes)
    }

    #[test]
    fn first_match_wins_in_file_order() {
        let t = table();
        assert_eq!(
            t.find(Some("api.example.com"), "POST", "/api/login"),
            Some(0)
        );
        assert_eq!(
            t.find(Some("api.example.com"), "GET", "/api/login"),
            Some(1)
        );
        assert_eq!(t.find(Some("other"), "GET", "/api/x"), Some(2));
    }

    #[test]
    fn a_host_rule_matches_the_canonical_host_only() {
        let t = table();
        assert_eq!(t.find(Some("api.example.com"), "GET", "/api/x"), Some(1));
        assert_eq!(t.find(None, "GET", "/api/x"), Some(2));
        assert_eq!(
            t.find(Some("api.example.com"), "GET", "/API/x"),
            Some(2),
            "paths keep their case"
        );
    }

    #[test]
    fn no_match_is_none() {
        let yaml = "listen: \"127.0.0.1:1\"\nroutes: [{ name: a, match: { path_prefix: /a }, upstream: \"h:1\" }]\n";
        let t = RouteTable::new(&Config::parse("t.yaml", yaml).unwrap().routes);
        assert_eq!(t.find(None, "GET", "/b"), None);
    }
}
