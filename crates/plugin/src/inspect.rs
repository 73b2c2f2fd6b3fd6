//! Static inspection of a driver file: is it a component, which contract
//! version does it export, and does it import only what the host provides.
//! Nothing here compiles or runs the driver.

use super::bindings::Contract;

/// What a driver file imports and exports, read from its top-level sections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspection {
    pub imports: Vec<Import>,
    pub exports: Vec<String>,
    /// The contract version whose driver interface it exports.
    pub contract: Contract,
}

/// One import and whether the host provides it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Import {
    pub name: String,
    pub provided: Provision,
}

/// How the host satisfies an import.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provision {
    /// Part of the contract world: logging, outgoing HTTP, clocks, random.
    Contract,
    /// Linked but inert: stdio goes to the log, no environment, no preopened
    /// directories, no sockets. Language runtimes import these by habit.
    Inert,
    /// Not provided: the driver cannot be loaded.
    Missing,
}

/// Why a file is not a loadable driver.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("not a WebAssembly file")]
    NotWasm,
    #[error(
        "is a core WebAssembly module, not a component (build it for wasm32-wasip2, or wrap it with `wasm-tools component new`)"
    )]
    CoreModule,
    #[error("is not a valid component: {0}")]
    Invalid(String),
    #[error("targets contract {found}; this host supports {}", supported())]
    WrongContract { found: String },
    #[error("does not export berth:driver/driver of any version this host supports, {} (it exports: {})", supported(), list_or_none(.exports))]
    MissingExport { exports: Vec<String> },
    #[error("imports {} which the host does not provide", .0.join(", "))]
    UnsupportedImports(Vec<String>),
}

/// The contract versions bound, as people read them.
fn supported() -> String {
    let all: Vec<&str> = Contract::ALL.iter().map(|c| c.package()).collect();
    all.join(" and ")
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "nothing".into()
    } else {
        items.join(", ")
    }
}

/// WASI 0.2 packages whose interfaces a driver may import, and how.
fn provision(name: &str) -> Provision {
    let (path, version) = match name.rsplit_once('@') {
        Some((p, v)) => (p, v),
        None => (name, ""),
    };
    if let Some(interface) = path.strip_prefix("berth:driver/") {
        let known = match Contract::of_version(version) {
            Some(Contract::V0_1) => matches!(interface, "log" | "types" | "state" | "net"),
            Some(Contract::V0_2) => {
                matches!(interface, "log" | "types" | "state" | "net" | "auth")
            }
            None => false,
        };
        return if known {
            Provision::Contract
        } else {
            Provision::Missing
        };
    }
    if !version.starts_with("0.2.") {
        return Provision::Missing;
    }
    match path {
        "wasi:http/outgoing-handler"
        | "wasi:http/types"
        | "wasi:clocks/wall-clock"
        | "wasi:clocks/monotonic-clock"
        | "wasi:random/random"
        | "wasi:io/error"
        | "wasi:io/poll"
        | "wasi:io/streams" => Provision::Contract,
        p if p.starts_with("wasi:cli/")
            || p.starts_with("wasi:filesystem/")
            || p.starts_with("wasi:sockets/")
            || p.starts_with("wasi:random/") =>
        {
            Provision::Inert
        }
        _ => Provision::Missing,
    }
}

/// Reads the top-level imports and exports of `bytes` and checks them against
/// the contract.
pub fn inspect(bytes: &[u8]) -> Result<Inspection, Rejection> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(Rejection::NotWasm);
    }
    if wasmparser::Parser::is_core_wasm(bytes) {
        return Err(Rejection::CoreModule);
    }
    let (mut imports, mut exports) = (Vec::new(), Vec::new());
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| Rejection::Invalid(e.to_string()))?;
        match payload {
            wasmparser::Payload::Version { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            wasmparser::Payload::ComponentImportSection(section) if depth == 1 => {
                for import in section {
                    let import = import.map_err(|e| Rejection::Invalid(e.to_string()))?;
                    let name = import.name.name.to_string();
                    imports.push(Import {
                        provided: provision(&name),
                        name,
                    });
                }
            }
            wasmparser::Payload::ComponentExportSection(section) if depth == 1 => {
                for export in section {
                    let export = export.map_err(|e| Rejection::Invalid(e.to_string()))?;
                    exports.push(export.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    let Some(contract) = exports.iter().find_map(|e| Contract::of_export(e)) else {
        if let Some(other) = exports
            .iter()
            .find(|e| e.starts_with("berth:driver/driver@"))
        {
            let found = format!(
                "berth:driver@{}",
                other.rsplit_once('@').map(|(_, v)| v).unwrap_or("?")
            );
            return Err(Rejection::WrongContract { found });
        }
        return Err(Rejection::MissingExport { exports });
    };
    let missing: Vec<String> = imports
        .iter()
        .filter(|i| i.provided == Provision::Missing)
        .map(|i| i.name.clone())
        .collect();
    if !missing.is_empty() {
        // A berth import of a version the host does not bind is a driver
        // built for another contract; one of a bound version that the host
        // lacks is not.
        let bound =
            |m: &str| (m.rsplit_once('@')).is_some_and(|(_, v)| Contract::of_version(v).is_some());
        if let Some(other) = missing
            .iter()
            .find(|m| m.starts_with("berth:driver/") && !bound(m))
        {
            let found = format!(
                "berth:driver@{}",
                other.rsplit_once('@').map(|(_, v)| v).unwrap_or("?")
            );
            return Err(Rejection::WrongContract { found });
        }
        return Err(Rejection::UnsupportedImports(missing));
    }
    Ok(Inspection {
        imports,
        exports,
        contract,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provisions() {
        let table = [
            ("berth:driver/log@0.1.0", Provision::Contract),
            ("berth:driver/state@0.1.0", Provision::Contract),
            ("berth:driver/net@0.1.0", Provision::Contract),
            ("berth:driver/disk@0.1.0", Provision::Missing),
            ("berth:driver/auth@0.1.0", Provision::Missing),
            ("berth:driver/log@0.2.0", Provision::Contract),
            ("berth:driver/auth@0.2.0", Provision::Contract),
            ("berth:driver/log@0.3.0", Provision::Missing),
            ("wasi:http/outgoing-handler@0.2.4", Provision::Contract),
            ("wasi:io/streams@0.2.12", Provision::Contract),
            ("wasi:cli/environment@0.2.0", Provision::Inert),
            ("wasi:filesystem/preopens@0.2.3", Provision::Inert),
            ("wasi:sockets/tcp@0.2.0", Provision::Inert),
            ("wasi:http/incoming-handler@0.2.0", Provision::Missing),
            ("wasi:cli/environment@0.3.0", Provision::Missing),
            ("evil:host/exec", Provision::Missing),
        ];
        for (name, want) in table {
            assert_eq!(provision(name), want, "{name}");
        }
    }

    #[test]
    fn rejects_non_components() {
        assert_eq!(inspect(b"hello world, not wasm"), Err(Rejection::NotWasm));
        let core = wat::parse_str("(module)").unwrap();
        assert_eq!(inspect(&core), Err(Rejection::CoreModule));
        let empty = wat::parse_str("(component)").unwrap();
        assert_eq!(
            inspect(&empty),
            Err(Rejection::MissingExport { exports: vec![] })
        );
    }
}
