//! `criguard generate`: the man pages and shell completions, rendered from
//! the clap definition of the command line itself so that they never drift
//! from it. Hidden: packaging (`hack/deb.sh`) runs it, operators read
//! its output with `man criguard` and their shell's completion.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

use super::Cli;

/// What `criguard generate` writes.
#[derive(clap::Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum GenerateCmd {
    /// Man pages (section 1): criguard.1 and one criguard-SUBCOMMAND.1 per subcommand.
    Man {
        /// The directory to write them to (created if missing).
        dir: PathBuf,
    },
    /// Shell completions: criguard.bash, _criguard (zsh) and criguard.fish.
    Completions {
        /// The directory to write them to (created if missing).
        dir: PathBuf,
    },
}

/// Shells completions are generated for, each with the file name its
/// completion directory expects (`bash-completion` wants the command's
/// name alone: packaging renames `criguard.bash`).
pub const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

/// One generated file: its name and its contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// File name, no directory (`criguard-serve.1`, `_criguard`).
    pub name: String,
    /// Its bytes.
    pub contents: Vec<u8>,
}

/// The command line's definition, as clap builds it (the program name
/// `criguard`, the version of this build).
fn command() -> clap::Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// The man pages: `criguard.1`, which lists the subcommands, then one page
/// per visible subcommand (`criguard-serve.1`, with all of its options).
pub fn man_pages() -> std::io::Result<Vec<Generated>> {
    let cmd = command();
    let page = |c: clap::Command| -> std::io::Result<Generated> {
        let man = clap_mangen::Man::new(c)
            .source(format!("criguard {}", env!("CARGO_PKG_VERSION")))
            .manual("criguard manual");
        let mut contents = Vec::new();
        man.render(&mut contents)?;
        Ok(Generated {
            name: man.get_filename(),
            contents,
        })
    };
    let mut pages = vec![page(cmd.clone())?];
    for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
        pages.push(page(sub.clone())?);
    }
    Ok(pages)
}

/// The completion scripts, one per shell in [`SHELLS`].
pub fn completions() -> Vec<Generated> {
    SHELLS
        .iter()
        .map(|&shell| {
            let mut cmd = command();
            let mut contents = Vec::new();
            clap_complete::generate(shell, &mut cmd, "criguard", &mut contents);
            Generated {
                name: clap_complete::Generator::file_name(&shell, "criguard"),
                contents,
            }
        })
        .collect()
}

/// Writes `files` into `dir` (created if missing); returns their paths.
pub fn write(dir: &Path, files: &[Generated]) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    files
        .iter()
        .map(|f| {
            let path = dir.join(&f.name);
            std::fs::write(&path, &f.contents).map(|()| path)
        })
        .collect()
}

/// `criguard generate man|completions DIR`: writes the files and prints
/// their paths, one a line; exit 1 on an I/O error.
pub fn run(cmd: GenerateCmd) -> ExitCode {
    let result = match cmd {
        GenerateCmd::Man { dir } => man_pages().and_then(|p| write(&dir, &p)),
        GenerateCmd::Completions { dir } => write(&dir, &completions()),
    };
    match result {
        Ok(paths) => {
            for p in paths {
                println!("{}", p.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("criguard: generate: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The visible subcommands' names, in the order of `criguard --help`.
    fn subcommands() -> Vec<String> {
        command()
            .get_subcommands()
            .filter(|c| !c.is_hide_set())
            .map(|c| c.get_name().to_owned())
            .collect()
    }

    fn text(g: &Generated) -> String {
        String::from_utf8(g.contents.clone()).unwrap()
    }

    #[test]
    fn every_subcommand_has_a_man_page_listed_on_the_main_page() {
        let subs = subcommands();
        for expected in ["serve", "check-config", "status", "evictions", "pods"] {
            assert!(subs.iter().any(|s| s == expected), "{expected}: {subs:?}");
        }
        assert!(!subs.iter().any(|s| s == "generate"), "hidden: {subs:?}");
        let pages = man_pages().unwrap();
        let names: Vec<&str> = pages.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names[0], "criguard.1");
        assert_eq!(names.len(), subs.len() + 1, "{names:?}");
        let main = text(&pages[0]);
        for s in &subs {
            assert!(names.contains(&format!("criguard-{s}.1").as_str()), "{s}");
            // roff escapes the hyphen: `check\-config`.
            let roff = s.replace('-', "\\-");
            assert!(main.contains(&roff), "criguard.1 does not name {s}");
        }
        assert!(main.contains(".TH criguard 1"), "{main}");
    }

    #[test]
    fn a_subcommand_page_documents_its_flags() {
        let pages = man_pages().unwrap();
        let serve = pages.iter().find(|p| p.name == "criguard-serve.1").unwrap();
        let serve = text(serve);
        for flag in [
            "listen",
            "runtime\\-endpoint",
            "eviction\\-hard",
            "state\\-dir",
        ] {
            assert!(serve.contains(&format!("\\-\\-{flag}")), "--{flag}");
        }
    }

    #[test]
    fn completions_name_every_subcommand_in_each_shell() {
        let files = completions();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["criguard.bash", "_criguard", "criguard.fish"]);
        for f in &files {
            let t = text(f);
            for s in subcommands() {
                assert!(t.contains(&s), "{} lacks {s}", f.name);
            }
            assert!(
                t.contains("eviction-hard"),
                "{} lacks serve's flags",
                f.name
            );
        }
    }

    #[test]
    fn write_creates_the_directory_and_each_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("a/b");
        let paths = write(&out, &completions()).unwrap();
        assert_eq!(paths.len(), SHELLS.len());
        for p in paths {
            assert!(std::fs::metadata(&p).unwrap().len() > 100, "{p:?}");
        }
    }
}
