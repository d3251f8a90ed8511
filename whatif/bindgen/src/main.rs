//! `switchyard-whatif-bindgen <module.wasm> <out-dir>`: writes the browser module of the
//! status page's what-if into `<out-dir>`: `<name>.js` (an ES module the page imports, no
//! bundler) and `<name>_bg.wasm`, as `wasm-bindgen --target web --no-typescript` would.
//! `--version` prints its own version and the wasm-bindgen version it generates for
//! (scripts/setup-whatif.sh reinstalls it when either differs from the repository's).
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use wasm_bindgen_cli_support::Bindgen;

fn run(args: &[String]) -> anyhow::Result<()> {
    let [input, out_dir] = args else {
        bail!("usage: switchyard-whatif-bindgen <module.wasm> <out-dir>");
    };
    Bindgen::new()
        .input_path(PathBuf::from(input))
        .web(true)?
        .typescript(false)
        // As the CLI does: the glue finds `<name>_bg.wasm` beside itself when the page's
        // `init()` names no module (the library's own default leaves that path out).
        .omit_default_module_path(false)
        .generate(PathBuf::from(out_dir))
        .with_context(|| format!("generating the JS glue of {input} into {out_dir}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--version") {
        println!(
            "{} {} (wasm-bindgen {})",
            env!("CARGO_PKG_NAME"),
            env!("CARGO_PKG_VERSION"),
            wasm_bindgen_shared::version()
        );
        return ExitCode::SUCCESS;
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchyard-whatif-bindgen: {e:#}");
            // 64 (EX_USAGE) for a wrong command line, as the project's binaries exit.
            ExitCode::from(if args.len() == 2 { 1 } else { 64 })
        }
    }
}
