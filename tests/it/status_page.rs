//! The status page on the admin listener, in a real headless Chromium (Debian's `chromium`, which
//! scripts/test installs when missing): it loads with no console message, shows every route, and
//! after a burst the key being limited (masked); it is one self-contained file (nothing fetched
//! elsewhere).

use crate::support::proxy::Proxy;
use crate::support::upstream::Upstream;
use std::process::Command;

/// The page as Chromium leaves it after running its scripts (five seconds of virtual time: two
/// polls), and what Chromium logged.
fn render(url: &str) -> (String, String) {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(url)
        .output()
        .expect("chromium (scripts/test installs it: apt-get install chromium)");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// SHA-256 in base64, as a Content-Security-Policy hash source writes it (the openssl CLI).
fn sha256_base64(bytes: &[u8]) -> String {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new("sh")
        .args(["-c", "openssl dgst -sha256 -binary | openssl base64 -A"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl");
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn the_status_page_shows_the_routes_and_the_key_being_limited() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&format!(
        "listen: \"{{listen}}\"\nadmin: \"{{admin}}\"\nroutes:\n  - name: api\n    upstream: \"{0}\"\n    \
         limits: [{{ name: per_key, capacity: 3, refill: \"1/h\", key: \"header:X-Api-Key\" }}]\n  \
         - {{ name: static, upstream: \"{0}\" }}\n",
        upstream.addr
    ));
    for _ in 0..10 {
        proxy.get("/x", &[("X-Api-Key", "mallory-5e3b")]);
    }
    proxy.get("/x", &[("X-Api-Key", "alice-77aa")]);

    let page = proxy.admin_get("/");
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    for outside in ["src=", "href=", "@import", "url("] {
        assert!(!page.body.contains(outside), "fetches something: {outside}");
    }

    // The policy lets exactly the page's inline script and style run, by their hashes.
    let csp = page.header("content-security-policy").unwrap_or_default();
    for tag in ["script", "style"] {
        let inline = page
            .body
            .split_once(&format!("<{tag}>"))
            .and_then(|(_, rest)| rest.split_once(&format!("</{tag}>")))
            .map(|(inside, _)| inside)
            .unwrap_or_else(|| panic!("no <{tag}> in the page"));
        let hash = format!("'sha256-{}'", sha256_base64(inline.as_bytes()));
        assert!(
            csp.contains(&format!("{tag}-src {hash}")),
            "status.html changed: its {tag} is {hash} (src/admin/guard.rs), the policy says {csp}"
        );
    }

    let (dom, log) = render(&format!("http://{}/", proxy.admin));
    assert!(dom.contains("data-loaded=\"1\""), "the polls ran: {dom}");
    assert!(dom.contains("data-route=\"api\""), "{dom}");
    assert!(dom.contains("data-route=\"static\""), "{dom}");
    assert!(
        dom.contains("rl:{api:mal…3b}:per_key"),
        "the limited key, masked: {dom}"
    );
    assert!(!dom.contains("ali…aa"), "never refused: {dom}");
    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:#?}");
}
