//! Files berth opens inside a directory the config names: a provider's
//! driver inside `plugins-dir`, its own files inside `state-dir`. The
//! directory is opened once and the file relative to it through cap-std,
//! which resolves every component (symlinks included, at any depth) within
//! the directory: a name or a symlink that leads out of it opens nothing.
//! A symlink that stays inside is followed; one with an absolute target
//! counts as leading out, wherever it points.

use std::fmt;
use std::io::Read as _;
use std::path::{Component, Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;

/// Why a file inside a directory could not be opened or read.
#[derive(Debug)]
pub struct FileError {
    /// The directory the file must be inside.
    pub dir: PathBuf,
    /// The file's name relative to `dir`, as the config gives it.
    pub name: PathBuf,
    pub kind: FileErrorKind,
}

/// What [`FileError`] found.
#[derive(Debug)]
#[non_exhaustive]
pub enum FileErrorKind {
    /// The name is absolute, holds `..` or is empty ([`name_problem`]).
    Name(&'static str),
    /// The name, or a symlink on its way, leads out of the directory.
    Outside,
    /// The directory itself cannot be opened.
    Dir(std::io::Error),
    /// No file has that name.
    NotFound,
    /// The name is a directory or some other thing than a regular file.
    NotAFile,
    /// The file is larger than the reader takes; nothing of it was read.
    TooLarge { size: u64, max: u64 },
    /// Opening or reading it failed otherwise.
    Io(std::io::Error),
}

impl FileError {
    /// The file's path, for messages: `dir` joined with `name`.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (path, dir) = (self.path(), self.dir.display());
        let path = path.display();
        match &self.kind {
            FileErrorKind::Name(why) => write!(
                f,
                "`{}` {why}: it must be a path relative to {dir}, naming a file inside it, \
                 without `..`",
                self.name.display()
            ),
            FileErrorKind::Outside => write!(
                f,
                "{path} leads outside {dir} (through `..` or a symlink); only a file inside \
                 the directory is opened, and a symlink in it must point inside it by a \
                 relative path"
            ),
            FileErrorKind::Dir(e) => write!(f, "cannot open the directory {dir}: {e}"),
            FileErrorKind::NotFound => write!(f, "no such file: {path}"),
            FileErrorKind::NotAFile => write!(f, "not a file: {path}"),
            FileErrorKind::TooLarge { size, max } => write!(
                f,
                "{path}: the file is {size} bytes, more than the {max} bytes a driver may be \
                 (max-driver-size); it was not read"
            ),
            FileErrorKind::Io(e) => write!(f, "cannot read {path}: {e}"),
        }
    }
}

impl std::error::Error for FileError {}

/// Why `name` cannot name a file inside a directory, if it cannot: it is
/// empty ("is empty"), absolute ("is an absolute path"), or holds a `..`
/// component ("holds `..`").
pub fn name_problem(name: &Path) -> Option<&'static str> {
    if name.as_os_str().is_empty() {
        Some("is empty")
    } else if name.has_root() || name.is_absolute() {
        Some("is an absolute path")
    } else if name.components().any(|c| c == Component::ParentDir) {
        Some("holds `..`")
    } else {
        None
    }
}

/// cap-std refuses a path that leads out of the directory with a
/// "permission denied" of its own, which the system did not give: it
/// carries no OS error number.
fn leads_outside(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied && e.raw_os_error().is_none()
}

fn open_dir(dir: &Path, name: &Path) -> Result<Dir, FileError> {
    let err = |kind| FileError {
        dir: dir.to_path_buf(),
        name: name.to_path_buf(),
        kind,
    };
    if let Some(why) = name_problem(name) {
        return Err(err(FileErrorKind::Name(why)));
    }
    // The directory itself is the operator's to choose (a symlink to it is
    // fine); what is inside it is confined to it.
    Dir::open_ambient_dir(dir, ambient_authority()).map_err(|e| err(FileErrorKind::Dir(e)))
}

fn io_kind(e: std::io::Error) -> FileErrorKind {
    if leads_outside(&e) {
        FileErrorKind::Outside
    } else if e.kind() == std::io::ErrorKind::NotFound {
        FileErrorKind::NotFound
    } else {
        FileErrorKind::Io(e)
    }
}

/// Opens the regular file `name` inside `dir` for reading, with what
/// [`std::fs::File::metadata`] says of it. Refused: a name that is not
/// relative ([`name_problem`]), one that leads out of `dir` through `..` or
/// a symlink, and anything but a regular file (checked before the open, so
/// a FIFO does not hold the open up, and again on the file opened).
pub fn open_inside(dir: &Path, name: &Path) -> Result<std::fs::File, FileError> {
    let root = open_dir(dir, name)?;
    let err = |kind| FileError {
        dir: dir.to_path_buf(),
        name: name.to_path_buf(),
        kind,
    };
    let meta = root.metadata(name).map_err(|e| err(io_kind(e)))?;
    if !meta.is_file() {
        return Err(err(FileErrorKind::NotAFile));
    }
    let file = root.open(name).map_err(|e| err(io_kind(e)))?.into_std();
    let meta = file.metadata().map_err(|e| err(FileErrorKind::Io(e)))?;
    if !meta.is_file() {
        return Err(err(FileErrorKind::NotAFile));
    }
    Ok(file)
}

/// The driver file `name` inside `plugins_dir`, read whole: at most
/// `max_bytes`, and refused unread when its size is over that. Opened as
/// [`open_inside`] opens it.
pub fn read_driver(plugins_dir: &Path, name: &Path, max_bytes: u64) -> Result<Vec<u8>, FileError> {
    let err = |kind| FileError {
        dir: plugins_dir.to_path_buf(),
        name: name.to_path_buf(),
        kind,
    };
    let file = open_inside(plugins_dir, name)?;
    let size = file
        .metadata()
        .map_err(|e| err(FileErrorKind::Io(e)))?
        .len();
    if size > max_bytes {
        return Err(err(FileErrorKind::TooLarge {
            size,
            max: max_bytes,
        }));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    // One byte past the cap: a file that grew since its size was read is
    // still refused, and never read whole.
    (file.take(max_bytes.saturating_add(1)))
        .read_to_end(&mut bytes)
        .map_err(|e| err(FileErrorKind::Io(e)))?;
    let read = bytes.len() as u64;
    if read > max_bytes {
        return Err(err(FileErrorKind::TooLarge {
            size: read,
            max: max_bytes,
        }));
    }
    Ok(bytes)
}

/// Checks that `name` inside `dir`, if it exists, stays inside `dir`: it is
/// not a symlink (at any depth) that leads out of it. For the files berth
/// opens by path where it cannot open them through a directory (SQLite's
/// database and its companions): a missing file is fine (it is made inside
/// `dir`), one reached through a symlink that stays inside too.
pub fn stays_inside(dir: &Path, name: &Path) -> Result<(), FileError> {
    let root = open_dir(dir, name)?;
    match root.metadata(name) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FileError {
            dir: dir.to_path_buf(),
            name: name.to_path_buf(),
            kind: io_kind(e),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// A plugins directory with `a.wasm` and `sub/b.wasm`, and beside it
    /// (outside) `out.wasm` and a directory `elsewhere/` holding `c.wasm`.
    fn tree() -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().expect("tempdir");
        let plugins = root.path().join("plugins");
        std::fs::create_dir_all(plugins.join("sub")).expect("mkdir");
        std::fs::create_dir(root.path().join("elsewhere")).expect("mkdir");
        std::fs::write(plugins.join("a.wasm"), b"a").expect("write");
        std::fs::write(plugins.join("sub/b.wasm"), b"b").expect("write");
        std::fs::write(root.path().join("out.wasm"), b"out").expect("write");
        std::fs::write(root.path().join("elsewhere/c.wasm"), b"c").expect("write");
        (root, plugins)
    }

    fn kind(dir: &Path, name: &str) -> Result<Vec<u8>, String> {
        read_driver(dir, Path::new(name), 1024).map_err(|e| match e.kind {
            FileErrorKind::Name(why) => why.to_owned(),
            FileErrorKind::Outside => "outside".into(),
            FileErrorKind::Dir(_) => "dir".into(),
            FileErrorKind::NotFound => "not found".into(),
            FileErrorKind::NotAFile => "not a file".into(),
            FileErrorKind::TooLarge { .. } => "too large".into(),
            FileErrorKind::Io(e) => format!("io: {e}"),
        })
    }

    #[test]
    fn a_driver_is_read_only_from_inside_the_plugins_directory() {
        let (root, plugins) = tree();
        let out = root.path().join("out.wasm");
        // Inside, directly, in a subdirectory, through symlinks that stay
        // inside (relative ones, also into a subdirectory and through a
        // symlinked subdirectory).
        symlink("a.wasm", plugins.join("to-a.wasm")).expect("symlink");
        symlink("sub/b.wasm", plugins.join("to-b.wasm")).expect("symlink");
        symlink("sub", plugins.join("also-sub")).expect("symlink");
        symlink("../a.wasm", plugins.join("sub/up-to-a.wasm")).expect("symlink");
        for (name, bytes) in [
            ("a.wasm", &b"a"[..]),
            ("./a.wasm", b"a"),
            ("sub/b.wasm", b"b"),
            ("to-a.wasm", b"a"),
            ("to-b.wasm", b"b"),
            ("also-sub/b.wasm", b"b"),
            ("sub/up-to-a.wasm", b"a"),
        ] {
            assert_eq!(kind(&plugins, name).as_deref(), Ok(bytes), "{name}");
        }

        // Out of it: by name, or by a symlink, relative or absolute, to a
        // file or to a directory on the way, or absolute though it points
        // inside.
        symlink("../out.wasm", plugins.join("up.wasm")).expect("symlink");
        symlink(&out, plugins.join("abs.wasm")).expect("symlink");
        symlink(plugins.join("a.wasm"), plugins.join("abs-inside.wasm")).expect("symlink");
        symlink("../elsewhere", plugins.join("away")).expect("symlink");
        symlink("../../out.wasm", plugins.join("sub/up2.wasm")).expect("symlink");
        symlink("../nothing.wasm", plugins.join("dangling.wasm")).expect("symlink");
        let outside = |name: &str| (name.to_owned(), Err("outside".to_owned()));
        for (name, want) in [
            outside("up.wasm"),
            outside("abs.wasm"),
            outside("abs-inside.wasm"),
            outside("away/c.wasm"),
            outside("sub/up2.wasm"),
            outside("dangling.wasm"),
            ("../out.wasm".into(), Err("holds `..`".into())),
            ("sub/../a.wasm".into(), Err("holds `..`".into())),
            (out.display().to_string(), Err("is an absolute path".into())),
            (String::new(), Err("is empty".into())),
            ("missing.wasm".into(), Err("not found".into())),
            ("sub".into(), Err("not a file".into())),
            (".".into(), Err("not a file".into())),
        ] {
            assert_eq!(kind(&plugins, &name), want, "{name}");
        }

        // What the error says: the file, the directory, why.
        let e = read_driver(&plugins, Path::new("up.wasm"), 1024).unwrap_err();
        let said = e.to_string();
        assert!(
            said.contains(&plugins.join("up.wasm").display().to_string())
                && said.contains("leads outside")
                && said.contains(&plugins.display().to_string()),
            "{said}"
        );
    }

    #[test]
    fn a_driver_over_the_limit_is_refused_unread() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Holes only: nothing to read quickly if it were read.
        std::fs::File::create(dir.path().join("big.wasm"))
            .and_then(|f| f.set_len(1 << 40))
            .expect("big file");
        std::fs::write(dir.path().join("ten.wasm"), [7; 10]).expect("write");
        let e = read_driver(dir.path(), Path::new("big.wasm"), 1 << 20).unwrap_err();
        assert!(
            matches!(e.kind, FileErrorKind::TooLarge { size, max } if size == 1 << 40 && max == 1 << 20),
            "{e}"
        );
        assert!(e.to_string().contains("max-driver-size"), "{e}");
        assert_eq!(
            read_driver(dir.path(), Path::new("ten.wasm"), 10).expect("reads"),
            [7; 10]
        );
        assert!(matches!(
            read_driver(dir.path(), Path::new("ten.wasm"), 9).map_err(|e| e.kind),
            Err(FileErrorKind::TooLarge { size: 10, max: 9 })
        ));
    }

    #[test]
    fn a_file_of_the_state_directory_may_not_be_a_symlink_out_of_it() {
        let (root, state) = tree();
        let out = root.path().join("out.wasm");
        symlink("a.wasm", state.join("inside.db")).expect("symlink");
        symlink(&out, state.join("abs.db")).expect("symlink");
        symlink("../out.wasm", state.join("up.db")).expect("symlink");
        symlink("../not-there.db", state.join("dangling.db")).expect("symlink");
        symlink("../elsewhere", state.join("away")).expect("symlink");
        for name in ["a.wasm", "inside.db", "missing.db", "sub"] {
            assert!(stays_inside(&state, Path::new(name)).is_ok(), "{name}");
        }
        for name in [
            "abs.db",
            "up.db",
            "dangling.db",
            "away/c.wasm",
            "away/new.db",
        ] {
            let e = stays_inside(&state, Path::new(name)).expect_err(name);
            assert!(matches!(e.kind, FileErrorKind::Outside), "{name}: {e}");
        }
        let e = stays_inside(&state, Path::new("../x.db")).expect_err("..");
        assert!(matches!(e.kind, FileErrorKind::Name(_)), "{e}");
    }
}
