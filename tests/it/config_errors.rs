//! One fixture per config error: `tests/fixtures/config/*.yaml`, each ending in the exact
//! `# error: ` lines the loader must produce, in order.

use ratelimit_proxy::config::{Config, ConfigError};
use std::path::Path;

#[test]
fn every_fixture_produces_exactly_its_messages() {
    let dir = Path::new("tests/fixtures/config");
    let mut fixtures: Vec<_> = std::fs::read_dir(dir)
        .expect("fixtures dir")
        .map(|e| e.unwrap().path())
        .collect();
    fixtures.sort();
    assert!(fixtures.len() >= 15, "fixtures went missing: {fixtures:?}");
    let mut failures = Vec::new();
    for path in &fixtures {
        let text = std::fs::read_to_string(path).unwrap();
        let want: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# error: "))
            .collect();
        assert!(
            !want.is_empty(),
            "{} has no `# error: ` line",
            path.display()
        );
        let got: Vec<String> = match Config::load(path) {
            Ok(_) => vec!["(loaded without error)".into()],
            Err(ConfigError::Invalid(problems)) => problems.iter().map(|p| p.to_string()).collect(),
            Err(e) => vec![e.to_string()],
        };
        if got != want {
            failures.push(format!(
                "{}\n  want: {want:#?}\n  got:  {got:#?}",
                path.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_shipped_examples_are_valid() {
    for path in [
        "config/routes.yaml",
        "config/routes-redis.yaml",
        "config/routes-compose.yaml",
        "config/routes-llm.yaml",
    ] {
        if let Err(e) = Config::load(Path::new(path)) {
            panic!("{path}:\n{e}");
        }
    }
}
