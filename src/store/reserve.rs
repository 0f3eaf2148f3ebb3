//! Disk space kept in reserve beside the db (`<db>-reserve`, [`RESERVE`] bytes of zeros), so a
//! WAL that filled its file system can still be copied back (issue 24's disk-full drill).
//!
//! A long-lived reader (a `sqlite3` shell left in a transaction) keeps the WAL from being reset, so
//! under load it can grow until the disk is full. Copying it back into the db then needs the db to
//! grow, for which there is no room: without the reserve crossbar never recovered on its own, and
//! would not even start again on that disk. The checkpoint thread gives the reserve up when the disk
//! is full and takes it again once the WAL has been reset and writes go through (`checkpoint`).
//!
//! The path is never followed (issue 46: a link placed there had its target overwritten with
//! zeros): whatever is at it is unlinked — a symbolic or hard link loses only this name — and the
//! reserve is created anew, exclusively (`O_CREAT | O_EXCL` never follows a link; a link that
//! appears in between fails the take, which is tried again later), and only a regular file of
//! its own counts as held.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Bytes held in reserve: a checkpoint grows the db by the pages the WAL adds, a few percent of
/// the WAL (about 70 KiB for an 8 MiB WAL of accounting rows), so this frees a WAL of hundreds of
/// MiB.
pub(super) const RESERVE: u64 = 8 << 20;

/// The reserve file of one db.
#[derive(Debug)]
pub(super) struct Reserve {
    path: PathBuf,
    size: u64,
}

impl Reserve {
    pub(super) fn of(db: &Path, size: u64) -> Reserve {
        let mut path = db.as_os_str().to_owned();
        path.push("-reserve");
        Reserve {
            path: PathBuf::from(path),
            size,
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the reserve is on disk, whole: a regular file of its own at the path (a link to
    /// one is not).
    pub(super) fn held(&self) -> bool {
        std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.is_file() && m.nlink() == 1 && m.len() == self.size)
    }

    /// Writes the reserve (real blocks, not a sparse file) as a new file, whatever was at the
    /// path unlinked first. On failure (no room, a link put there meanwhile) nothing is left
    /// behind and the error says why.
    pub(super) fn take(&self) -> std::io::Result<()> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let written = write_zeros(&self.path, self.size);
        if written.is_err() {
            let _ = std::fs::remove_file(&self.path);
        }
        written
    }

    /// Gives the space back. True when there was a reserve to give.
    pub(super) fn release(&self) -> bool {
        std::fs::remove_file(&self.path).is_ok()
    }
}

fn write_zeros(path: &Path, size: u64) -> std::io::Result<()> {
    const PIECE: usize = 64 << 10;
    let zeros = [0u8; PIECE];
    let mut file: File = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let mut left = size;
    while left > 0 {
        let n = left.min(PIECE as u64) as usize;
        file.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_taken_whole_and_given_back() {
        let dir = std::env::temp_dir().join(format!("crossbar-reserve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let reserve = Reserve::of(&dir.join("crossbar.db"), 200_000);
        assert_eq!(reserve.path(), dir.join("crossbar.db-reserve"));
        assert!(!reserve.held());
        reserve.take().unwrap();
        assert!(reserve.held());
        assert_eq!(std::fs::metadata(reserve.path()).unwrap().len(), 200_000);
        assert!(reserve.release());
        assert!(!reserve.held() && !reserve.release());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 46: a link at the reserve's path had its target overwritten with zeros. A symbolic
    /// or hard link there is never written through: it loses the name, and the reserve is a file
    /// of its own; a link to a file of the reserve's size is not a reserve held.
    #[test]
    fn a_link_at_the_reserves_path_is_never_written_through_issue_46() {
        let dir =
            std::env::temp_dir().join(format!("crossbar-reserve-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("precious");
        let reserve = Reserve::of(&dir.join("crossbar.db"), 4096);
        for hard in [false, true] {
            std::fs::write(&victim, [7u8; 4096]).unwrap();
            if hard {
                std::fs::hard_link(&victim, reserve.path()).unwrap();
            } else {
                std::os::unix::fs::symlink(&victim, reserve.path()).unwrap();
            }
            assert!(!reserve.held(), "hard={hard}: a link is not the reserve");
            reserve.take().unwrap();
            assert!(reserve.held());
            let intact = std::fs::read(&victim).unwrap().iter().all(|b| *b == 7);
            assert!(intact, "hard={hard}: the link's target was written");
            let meta = std::fs::symlink_metadata(reserve.path()).unwrap();
            assert!(meta.is_file() && meta.nlink() == 1);
            assert!(reserve.release());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
