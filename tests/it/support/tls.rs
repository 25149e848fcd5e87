//! Certificates for tests, made with the openssl CLI.

use std::path::Path;
use std::process::Command;

/// A CA (`ca.crt`, `ca.key`), and a server certificate it signed for 127.0.0.1 and localhost
/// (`server.crt`, `server.key`), in `dir`.
pub fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "1",
            "-subj",
            "/CN=ratelimit-proxy test CA",
        ],
    );
    signed(dir, "server", "/CN=localhost", "IP:127.0.0.1,DNS:localhost");
}

/// A certificate for the DNS name `name`, signed by the CA that `certificates(dir)` made:
/// `{name}.crt` and `{name}.key` in `dir`.
pub fn certificate_for(dir: &Path, name: &str) {
    signed(dir, name, &format!("/CN={name}"), &format!("DNS:{name}"));
}

/// `{stem}.key` and `{stem}.crt` for `subject` with `san`, signed by the CA in `dir`.
fn signed(dir: &Path, stem: &str, subject: &str, san: &str) {
    let (key, csr, crt, ext) = (
        format!("{stem}.key"),
        format!("{stem}.csr"),
        format!("{stem}.crt"),
        format!("{stem}.ext"),
    );
    std::fs::write(dir.join(&ext), format!("subjectAltName={san}\n")).unwrap();
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subject,
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "1",
            "-extfile",
            &ext,
        ],
    );
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
