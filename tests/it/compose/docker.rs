//! What `docker compose up` needs to build and start the containers: the files it mounts, the
//! build contexts and what their Dockerfiles copy, and a config the proxy accepts.

use super::{bind_mounts, host_source, proxy_config, read, root, services, shown, COMPOSE};
use crate::support::proxy::BIN;
use serde_yaml::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn every_bind_mount_source_exists() {
    let mounts: Vec<_> = services()
        .into_iter()
        .flat_map(|(name, service)| {
            let mounts = bind_mounts(&service);
            mounts.into_iter().map(move |m| (name.clone(), m))
        })
        .collect();
    assert!(!mounts.is_empty(), "{COMPOSE}: no bind mounts found");
    let missing: Vec<String> = mounts
        .iter()
        .filter(|(_, m)| !host_source(m).exists())
        .map(|(name, m)| format!("service `{name}` mounts {}", m.source))
        .collect();
    assert!(
        missing.is_empty(),
        "{COMPOSE}: bind-mount sources that do not exist:\n{}",
        missing.join("\n")
    );
}

/// (context, Dockerfile) of every service that builds an image, relative to the crate root.
fn builds() -> BTreeSet<(PathBuf, PathBuf)> {
    let builds: BTreeSet<_> = services()
        .iter()
        .filter_map(|(_, s)| {
            let build = &s["build"];
            let (context, dockerfile) = match build {
                Value::String(context) => (context.as_str(), "Dockerfile"),
                Value::Mapping(_) => (
                    build["context"].as_str().unwrap_or("."),
                    build["dockerfile"].as_str().unwrap_or("Dockerfile"),
                ),
                _ => return None,
            };
            let context = PathBuf::from(context);
            Some((context.clone(), context.join(dockerfile)))
        })
        .collect();
    assert!(!builds.is_empty(), "{COMPOSE}: no service has `build:`");
    builds
}

#[test]
fn every_build_context_has_its_dockerfile() {
    for (context, dockerfile) in builds() {
        assert!(
            root().join(&context).is_dir(),
            "{COMPOSE}: build context {} is not a directory",
            context.display()
        );
        assert!(
            root().join(&dockerfile).is_file(),
            "{COMPOSE}: {} does not exist",
            dockerfile.display()
        );
    }
}

/// Dockerfile instructions, one per string: comments dropped, `\` continuations joined.
fn instructions(dockerfile: &str) -> Vec<String> {
    let mut done = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines().map(str::trim) {
        if line.starts_with('#') {
            continue;
        }
        if let Some(part) = line.strip_suffix('\\') {
            current.push_str(part);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        let instruction = current.trim();
        if !instruction.is_empty() {
            done.push(instruction.to_owned());
        }
        current.clear();
    }
    done
}

/// The build-context paths that COPY and ADD read. `--from` reads another stage, not the context,
/// and ADD of a URL reads the network.
fn copied_sources(dockerfile: &str) -> Vec<String> {
    let mut sources = Vec::new();
    for instruction in instructions(dockerfile) {
        let (keyword, args) = instruction
            .split_once(char::is_whitespace)
            .unwrap_or_default();
        if !["COPY", "ADD"]
            .iter()
            .any(|k| keyword.eq_ignore_ascii_case(k))
        {
            continue;
        }
        let mut rest = args.trim_start();
        let mut flags = Vec::new();
        while rest.starts_with("--") {
            let (flag, after) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            flags.push(flag);
            rest = after.trim_start();
        }
        if flags.iter().any(|f| f.starts_with("--from")) {
            continue;
        }
        let mut words: Vec<String> = if rest.starts_with('[') {
            serde_yaml::from_str(rest).unwrap_or_else(|e| panic!("{instruction}: {e}"))
        } else {
            rest.split_whitespace().map(str::to_owned).collect()
        };
        words.pop(); // the destination
        sources.extend(words.into_iter().filter(|w| !w.contains("://")));
    }
    sources
}

/// Literal `.dockerignore` patterns (globs and exceptions are not evaluated).
fn ignored_paths(context: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root().join(context).join(".dockerignore"));
    text.unwrap_or_default()
        .lines()
        .map(|l| l.trim().trim_matches('/'))
        .filter(|l| !l.is_empty() && !l.starts_with(['#', '!']) && !l.contains(['*', '?', '[']))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_file_the_dockerfile_copies_is_in_the_build_context() {
    for (context, dockerfile) in builds() {
        let sources = copied_sources(&read(&dockerfile));
        assert!(
            !sources.is_empty(),
            "{}: no COPY from the build context found",
            dockerfile.display()
        );
        let ignored = ignored_paths(&context);
        for source in sources {
            let path = source.trim_start_matches("./").trim_end_matches('/');
            assert!(
                root().join(&context).join(path).exists(),
                "{}: COPY {source}: not in the build context {}",
                dockerfile.display(),
                context.display()
            );
            let excluded = ignored
                .iter()
                .find(|p| path == p.as_str() || path.starts_with(&format!("{p}/")));
            assert!(
                excluded.is_none(),
                "{}: COPY {source}: .dockerignore excludes it ({excluded:?})",
                dockerfile.display()
            );
        }
    }
}

#[test]
fn the_proxy_accepts_the_config_compose_gives_it() {
    let config = proxy_config();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&config.host_path)
        .arg("--check")
        .output()
        .unwrap_or_else(|e| panic!("run {BIN}: {e}"));
    assert!(
        out.status.success(),
        "{COMPOSE}: service `{}` loads {} ({}), which `--check` rejects:\n{}",
        config.service,
        config.container_path,
        shown(&config.host_path),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The image is built once: one service builds and tags it, and every other service that runs it
/// names the tag and never pulls it (there is nothing to pull).
#[test]
fn the_image_is_built_once_and_never_pulled() {
    let services = services();
    let built: Vec<(&String, &str)> = services
        .iter()
        .filter(|(_, s)| !s["build"].is_null())
        .map(|(name, s)| (name, s["image"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        built.len(),
        1,
        "{COMPOSE}: more than one service builds: {built:?}"
    );
    let (builder, tag) = built[0];
    assert!(
        !tag.is_empty(),
        "{COMPOSE}: {builder} builds an image without naming it"
    );
    for (name, s) in &services {
        if s["image"].as_str() == Some(tag) && name != builder {
            assert_eq!(
                s["pull_policy"].as_str(),
                Some("never"),
                "{COMPOSE}: {name} runs {tag}, which {builder} builds: it must not be pulled"
            );
        }
    }
}

/// The runtime image has the system trust store, which `rediss://` and `https://` upstreams verify
/// against by default.
#[test]
fn the_runtime_image_has_ca_certificates() {
    let dockerfile = read(Path::new("Dockerfile"));
    let runtime = dockerfile
        .rsplit_once("\nFROM ")
        .map(|(_, last)| last)
        .unwrap_or_default();
    assert!(
        runtime.contains("ca-certificates"),
        "the last stage:\n{runtime}"
    );
}

/// The image ships the binaries without their debug info (the release profile keeps it for the
/// benchmarks' callgrind view): every binary the runtime stage copies was stripped into /out.
#[test]
fn the_image_ships_stripped_binaries() {
    let dockerfile = read(Path::new("Dockerfile"));
    for binary in ["ratelimit-proxy", "demo_upstream"] {
        assert!(
            dockerfile.contains(&format!("strip --strip-debug -o /out/{binary} ")),
            "Dockerfile: {binary} is not stripped into /out"
        );
    }
    assert!(dockerfile.contains("COPY --from=build /out/ratelimit-proxy /out/demo_upstream"));
}
