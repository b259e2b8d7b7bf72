"""What a sandboxed program sees of the filesystem.

`exposed_paths()` lists what the interpreter needs, read-only: its own folders (every `sys.path`
entry, the folders of every shared object it has loaded, its executable) and the system library
folders, the time-zone data and the loader cache. With a mount namespace, `build_root` makes a
read-only root of exactly those paths (at their usual places), a minimal `/dev` and `/etc`, and
empty mount points; `program_mounts` then gives each program one private tmpfs (size-limited)
behind `/sandbox` (its working dir), `/tmp` and `/dev/shm`, and a fresh `/proc` of its own pid
namespace. Without a mount namespace the same list is what Landlock lets the program read.
"""

from __future__ import annotations

import os
import sys
import sysconfig

from . import syscalls as sc

WORKDIR = "/sandbox"
PRIVATE = "/.private"  # mount point of each program's tmpfs; /sandbox, /tmp and /dev/shm are binds into it
SYSTEM_PATHS = (
    "/usr/lib",
    "/usr/lib64",
    "/usr/lib32",
    "/lib",
    "/lib64",
    "/lib32",
    "/usr/share/zoneinfo",
    "/etc/ld.so.cache",
    "/etc/localtime",
)
DEVICES = ("null", "zero", "full", "random", "urandom")
WRITABLE_DEVICES = ("null", "zero", "full")
HOSTS = "127.0.0.1 localhost\n::1 localhost\n"
# the read-only root is built on a tmpfs mounted over /tmp in the zygote's own mount namespace: no
# folder to create on the host, none left behind; nothing the sandbox exposes may live under /tmp
STAGE = "/tmp"
_PER_PROGRAM = (WORKDIR, PRIVATE, "/tmp", "/dev/shm", "/proc")


def hidden(path: str) -> bool:
    """Whether `path` lies where the per-program mounts (or the stage) would cover it."""
    return any(path == p or path.startswith(p + "/") for p in _PER_PROGRAM)


def _loaded_objects() -> list[str]:
    """Shared objects mapped into this process (libpython, extension modules, libc)."""
    found = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5]:
                    found.append(parts[5].strip())
    except OSError:
        pass
    return found


def interpreter_paths() -> list[str]:
    """Canonical paths the interpreter reads: sys.path, the loaded libraries' folders, the executable."""
    paths = [p for p in sys.path if p and os.path.exists(p)]
    paths += [os.path.dirname(p) for p in _loaded_objects()]
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir and os.path.isdir(libdir):
        paths.append(libdir)
    paths.append(os.path.realpath(sys.executable))
    return [os.path.realpath(p) for p in paths]


def collapse(paths: list[str]) -> list[str]:
    """Sorted, without duplicates and without paths inside another listed folder."""
    out: list[str] = []
    for p in sorted(set(paths)):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


def exposed_paths() -> tuple[list[str], list[tuple[str, str]]]:
    """(canonical paths to bind read-only, (link, target) symlinks to recreate such as /lib -> usr/lib)."""
    real, links = interpreter_paths(), []
    for p in SYSTEM_PATHS:
        if os.path.islink(p):
            links.append((p, os.readlink(p)))
            real.append(os.path.realpath(p))
        elif os.path.exists(p):
            real.append(p)
    for p in (*sys.path, sys.executable):  # non-canonical names the interpreter uses for itself
        if p and os.path.exists(p) and os.path.realpath(p) != os.path.abspath(p):
            links.append((os.path.abspath(p), os.path.realpath(p)))
    return collapse([p for p in real if os.path.exists(p)]), links


def _make_dirs(root: str, path: str) -> bool:
    """Create `path`'s folders under `root` as plain dirs; False when a component is a symlink there."""
    current = root
    for part in path.strip("/").split("/"):
        current = os.path.join(current, part)
        if os.path.islink(current):
            return False
        if not os.path.exists(current):
            os.mkdir(current, 0o755)
    return True


def _bind_ro(root: str, path: str) -> None:
    target = root + path
    if os.path.isdir(path):
        _make_dirs(root, path)
    else:
        _make_dirs(root, os.path.dirname(path))
        if not os.path.exists(target):
            open(target, "w").close()
    sc.bind_readonly(path, target)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def build_root(root: str, paths: list[str], links: list[tuple[str, str]], host_proc: bool) -> None:
    """Make `root` (an empty dir) the read-only root of this mount namespace; enter it.

    `host_proc`: bind the host's /proc under the future /proc, where each program mounts its own;
    a user namespace may mount a proc only where one is already fully visible.
    """
    sc.mount(None, "/", None, sc.MS_REC | sc.MS_PRIVATE)
    sc.mount("tmpfs", root, "tmpfs", sc.MS_NOSUID | sc.MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    for path in paths:
        _bind_ro(root, path)
    for link, target in links:
        where = root + link
        if _make_dirs(root, os.path.dirname(link)) and not os.path.lexists(where):
            os.symlink(target, where)
    for d in (WORKDIR, PRIVATE, "/tmp", "/dev/shm", "/proc", "/etc", "/.old"):
        _make_dirs(root, d)
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            open(f"{root}/dev/{name}", "w").close()
            sc.mount(f"/dev/{name}", f"{root}/dev/{name}", None, sc.MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        os.symlink(target, f"{root}/dev/{name}")
    os.symlink("/proc/self/fd/2", f"{root}/dev/stderr")
    _write(f"{root}/etc/hosts", HOSTS)
    if host_proc:
        sc.mount("/proc", f"{root}/proc", None, sc.MS_BIND | sc.MS_REC)
    sc.pivot_root(root, f"{root}/.old")
    os.chdir("/")
    sc.umount("/.old", sc.MNT_DETACH)
    os.rmdir("/.old")
    sc.mount(None, "/", None, sc.MS_REMOUNT | sc.MS_BIND | sc.MS_RDONLY | sc.MS_NOSUID | sc.MS_NODEV)


_PRIVATE_FLAGS = sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC


def program_mounts(disk_bytes: int, proc: bool) -> None:
    """One tmpfs of `disk_bytes` behind /sandbox, /tmp and /dev/shm; a fresh /proc."""
    sc.mount("tmpfs", PRIVATE, "tmpfs", _PRIVATE_FLAGS, f"size={disk_bytes},nr_inodes=16384,mode=0755")
    for name, target, mode in (("work", WORKDIR, 0o700), ("tmp", "/tmp", 0o1777), ("shm", "/dev/shm", 0o1777)):
        os.mkdir(f"{PRIVATE}/{name}")
        os.chmod(f"{PRIVATE}/{name}", mode)
        sc.mount(f"{PRIVATE}/{name}", target, None, sc.MS_BIND)
    if proc:
        sc.mount("proc", "/proc", "proc", sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC)


def adopt_private(disk_bytes: int, mounted_bytes: int, uid: int | None) -> None:
    """Fit the prepared tmpfs to one program: its size, and its working dir owned by its uid."""
    if disk_bytes != mounted_bytes:
        sc.mount(None, PRIVATE, None, sc.MS_REMOUNT | _PRIVATE_FLAGS, f"size={disk_bytes}")
    if uid is not None:
        os.chown(f"{PRIVATE}/work", uid, uid)


def landlock_rules(paths: list[str], workdir: str, private_root: bool) -> list[tuple[str, int]]:
    """Landlock's allow list: read the exposed paths, read/write the working dir (and, in the private
    root, /tmp, /dev/shm), read/write the harmless devices."""
    rw = sc.landlock_fs_rights(99)
    rules = [(p, sc.FS_READ) for p in paths]
    device = sc.FS_READ_FILE | sc.FS_WRITE_FILE | sc.FS_TRUNCATE | sc.FS_IOCTL_DEV
    rules += [(f"/dev/{d}", device) for d in WRITABLE_DEVICES]
    rules += [("/dev/random", sc.FS_READ_FILE), ("/dev/urandom", sc.FS_READ_FILE)]
    rules.append((workdir, rw))
    if private_root:
        # everything visible in the private root is meant to be: listing any folder is harmless
        rules += [("/", sc.FS_READ_DIR), ("/etc", sc.FS_READ), ("/proc", sc.FS_READ), ("/tmp", rw), ("/dev/shm", rw)]
    return rules
