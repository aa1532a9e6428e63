//! Golden files: every emitter's output and the printed plan for the seed's example with tails.
//! `SPILLWAY_BLESS=1 cargo test -p spillway-plan golden` rewrites them after a deliberate change.

use std::path::PathBuf;

use spillway_plan::emit::render;
use spillway_plan::{Target, plan, report};

use crate::support::{seed_deployment, seed_measurement};

fn check(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/seed")
        .join(name);
    if std::env::var_os("SPILLWAY_BLESS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (SPILLWAY_BLESS=1 writes it)", path.display()));
    assert!(
        expected == actual,
        "{} differs from the golden file (SPILLWAY_BLESS=1 rewrites it):\n--- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}

#[test]
fn every_emitter_matches_its_golden_file() {
    let p = plan(&seed_measurement(true), &seed_deployment()).unwrap();
    for target in Target::ALL {
        let file = render(&p, target).unwrap();
        check(file.file_name, &file.text);
    }
}

#[test]
fn the_printed_plan_matches_its_golden_file() {
    let p = plan(&seed_measurement(true), &seed_deployment()).unwrap();
    check("plan.txt", &report::text(&p));
}
