//! Used by the reliability and CLI suites: a tiny tmpfs mounted for one test, a real file system
//! that fills in the middle of a write. Mounting needs root (CI runs as root).

use std::path::{Path, PathBuf};

pub struct TinyFs {
    dir: tempfile::TempDir,
}

impl TinyFs {
    /// Mounts a tmpfs of `bytes`, or says why it cannot (not root, no `mount`).
    pub fn try_mount(bytes: u64) -> Result<TinyFs, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir for the mount point: {e}"))?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(out) if out.status.success() => Ok(TinyFs { dir }),
            Ok(out) => Err(format!(
                "`mount -t tmpfs` refused (run as root, as CI does): {} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => Err(format!(
                "`mount -t tmpfs` cannot run (run as root, as CI does): {e}"
            )),
        }
    }

    /// Mounts a tmpfs of `bytes`; where it is not permitted the test fails saying so, rather
    /// than passing without having run.
    pub fn mount(bytes: u64) -> TinyFs {
        TinyFs::try_mount(bytes).unwrap_or_else(|e| panic!("this test needs a tmpfs: {e}"))
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn remount(&self, opts: &str) {
        let ok = std::process::Command::new("mount")
            .args(["-o", &format!("remount,{opts}")])
            .arg(self.dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "remount {opts}");
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the file system with one file until it refuses more.
pub fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let block = vec![0u8; 4096];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
    path
}
