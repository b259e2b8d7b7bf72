"""Linux system calls the sandbox needs that Python 3.11's `os` lacks, through ctypes.

Namespaces (`unshare`), mounts (`mount`, `umount2`, `pivot_root`), process attributes (`prctl`,
`capset`), Landlock and seccomp. Every wrapper raises `OSError` with the errno on failure.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080
NAMESPACE_FLAGS = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
) | CLONE_NEWTIME

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

# statvfs f_flag bits -> the mount flags a read-only remount must keep (a user namespace may not
# clear flags of a mount it inherited)
_STATVFS_TO_MS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME}
_ST_RELATIME = 4096

# syscall numbers as (x86_64, aarch64): x86_64 from asm/unistd_64.h, aarch64 from asm-generic/unistd.h;
# None where the architecture lacks the call
_USED = {"pivot_root": (155, 41), "capset": (126, 91), "socket": (41, 198), "clone": (56, 220), "clone3": (435, 435)}
_DENIED = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "pidfd_getfd": (438, 438),
    "process_madvise": (440, 440), "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "chroot": (161, 51), "unshare": (272, 97), "setns": (308, 268), "open_tree": (428, 428),
    "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432),
    "fspick": (433, 433), "mount_setattr": (442, 442), "bpf": (321, 280), "perf_event_open": (298, 241),
    "userfaultfd": (323, 282), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105), "finit_module": (313, 273),
    "delete_module": (176, 106), "reboot": (169, 142), "swapon": (167, 224), "swapoff": (168, 225),
    "acct": (163, 89), "quotactl": (179, 60), "syslog": (103, 116), "settimeofday": (164, 170),
    "clock_settime": (227, 112), "adjtimex": (159, 171), "clock_adjtime": (305, 266), "sethostname": (170, 161),
    "setdomainname": (171, 162), "iopl": (172, None), "ioperm": (173, None), "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264), "fanotify_init": (300, 262), "personality": (135, 92), "vhangup": (153, 58),
    "uselib": (134, None), "lookup_dcookie": (212, 18),
}  # fmt: skip
"""What seccomp refuses (EPERM) besides the checks of socket and clone arguments."""


def _table(column: int) -> dict:
    """One architecture's numbers: the calls used by name, and "deny": the refused ones."""
    deny = {k: v[column] for k, v in _DENIED.items() if v[column] is not None}
    return {**{k: v[column] for k, v in _USED.items()}, "deny": deny}


# architecture -> (AUDIT_ARCH value, syscall numbers)
_ARCHES = {"x86_64": (0xC000003E, _table(0)), "aarch64": (0xC00000B7, _table(1))}
ARCH = platform.machine()
_NR = _ARCHES.get(ARCH, (0, {}))[1]


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _sys(number: int, *args) -> int:
    return int(_libc.syscall(ctypes.c_long(number), *args))


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def unshare(flags: int) -> None:
    """Move this process into new namespaces (`CLONE_NEW*` flags)."""
    _check(_libc.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def setns(fd: int, nstype: int) -> None:
    """Join the namespace `fd` refers to (for a pid namespace: the one of children forked next)."""
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), f"setns({nstype:#x})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)),
        f"mount {source or fstype or ''} on {target}",
    )


def bind_readonly(source: str, target: str) -> None:
    """Bind `source` onto `target`, then make the bind read-only, nosuid and nodev."""
    mount(source, target, None, MS_BIND)
    st = os.statvfs(source)
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
    for bit, ms in _STATVFS_TO_MS.items():
        if st.f_flag & bit:
            flags |= ms
    if st.f_flag & _ST_RELATIME:
        flags |= MS_RELATIME
    mount(None, target, None, flags)


def umount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(_b(target), ctypes.c_int(flags)), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    _check(_sys(_NR["pivot_root"], _b(new_root), _b(put_old)), f"pivot_root({new_root})")


def prctl(option: int, arg: int = 0) -> None:
    zero = ctypes.c_ulong(0)
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), zero, zero, zero), f"prctl({option})")


def set_name(name: str) -> None:
    """Name this process in ps/top (at most 15 bytes)."""
    buf = ctypes.create_string_buffer(name.encode()[:15])
    _libc.prctl(ctypes.c_int(15), buf, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))  # PR_SET_NAME


def set_parent_death_signal(sig: int) -> None:
    """Have the kernel send `sig` to this process when its parent (the forking thread) exits."""
    prctl(PR_SET_PDEATHSIG, sig)


def no_new_privs() -> None:
    """No execve can grant privileges from now on (setuid bits, file capabilities)."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def drop_capabilities() -> None:
    """Clear the effective, permitted and inheritable capability sets of this process."""
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # two {effective, permitted, inheritable} u32 triples, all zero
    _check(_sys(_NR["capset"], header, data), "capset")


def write_id_maps(uid: int, gid: int) -> None:
    """Map `uid`/`gid` to themselves in the user namespace this process just created."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


# ---- Landlock ----------------------------------------------------------------------------------
_LL_CREATE, _LL_ADD_RULE, _LL_RESTRICT = 444, 445, 446  # the same on every architecture
_LL_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
FS_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: Landlock is not available)."""
    if not _NR:
        return 0
    return max(_sys(_LL_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1)), 0)  # ..._VERSION


def landlock_fs_rights(abi: int) -> int:
    """Every filesystem access right the ABI knows (all are handled, so all are denied by default)."""
    rights = (1 << 13) - 1  # EXECUTE .. MAKE_SYM (ABI 1)
    for version, bit in ((2, 1 << 13), (3, FS_TRUNCATE), (5, FS_IOCTL_DEV)):  # REFER, TRUNCATE, IOCTL_DEV
        if abi >= version:
            rights |= bit
    return rights


def landlock_ruleset(rules: list[tuple[str, int]], abi: int) -> int:
    """A ruleset (its fd) that allows only `rules` (path, rights beneath it) and denies TCP bind and
    connect (ABI >= 4), signals and abstract unix sockets outside its domain (ABI >= 6). Paths this
    process cannot reach are skipped. A rule on a mount point also covers what is mounted there later."""
    handled = landlock_fs_rights(abi)
    net = _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("=QQQ", handled, net, scoped)[: 24 if abi >= 6 else 16 if abi >= 4 else 8]
    ruleset = _check(_sys(_LL_CREATE, attr, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0)), "landlock")
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except (FileNotFoundError, PermissionError):  # absent, or unreachable for this uid anyway
                continue
            try:
                if not os.path.isdir(path):
                    rights &= _FILE_RIGHTS
                rule = struct.pack("=Qi", rights & handled, fd)
                _check(_sys(_LL_ADD_RULE, ruleset, _LL_RULE_PATH_BENEATH, rule, ctypes.c_uint32(0)), f"landlock {path}")
            finally:
                os.close(fd)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def landlock_enforce(ruleset: int) -> None:
    """Confine this thread (and what it forks) to `ruleset`; sets no_new_privs, which Landlock requires."""
    no_new_privs()
    _check(_sys(_LL_RESTRICT, ruleset, ctypes.c_uint32(0)), "landlock_restrict_self")


def landlock_restrict(rules: list[tuple[str, int]], abi: int) -> None:
    """`landlock_enforce` a ruleset of `rules` built now."""
    ruleset = landlock_ruleset(rules, abi)
    try:
        landlock_enforce(ruleset)
    finally:
        os.close(ruleset)


# ---- seccomp -----------------------------------------------------------------------------------
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_KILL_PROCESS, _RET_ALLOW, _RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_AF_UNIX = 1
_X32_BIT = 0x40000000
_NEW_NAMESPACES = NAMESPACE_FLAGS


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def seccomp_supported() -> bool:
    """Whether this architecture has a syscall table here (x86_64, aarch64)."""
    return bool(_NR)


def seccomp_program() -> list[tuple[int, int, int, int]]:
    """The BPF filter: (code, jt, jf, k) instructions.

    Other architectures' syscalls kill the process; the calls in the deny table, sockets of any family
    but AF_UNIX and clone() with namespace flags fail with EPERM; clone3 fails with ENOSYS (libc then
    falls back to clone, whose flags the filter can read); everything else is allowed.
    """
    audit_arch, nr = _ARCHES[ARCH]
    eperm, enosys = _RET_ERRNO | 1, _RET_ERRNO | 38
    # (label or None, code, jt label, jf label, k); labels: "deny", "allow", "next" (fall through)
    body: list[tuple] = [(None, _LD_W_ABS, None, None, 4), (None, _JEQ, "next", "kill", audit_arch)]
    body.append((None, _LD_W_ABS, None, None, 0))
    if ARCH == "x86_64":
        body.append((None, _JGE, "deny", "next", _X32_BIT))  # the x32 ABI: other numbers
    for number in sorted(set(nr["deny"].values())):
        body.append((None, _JEQ, "deny", "next", number))
    body += [
        (None, _JEQ, "enosys", "next", nr["clone3"]),
        (None, _JEQ, "socket", "next", nr["socket"]),
        (None, _JEQ, "clone", "allow", nr["clone"]),
        ("clone", _LD_W_ABS, None, None, 16),  # args[0], low word: the clone flags
        (None, _JSET, "deny", "allow", _NEW_NAMESPACES),
        ("socket", _LD_W_ABS, None, None, 16),  # args[0]: the address family
        (None, _JEQ, "allow", "deny", _AF_UNIX),
        ("allow", _RET, None, None, _RET_ALLOW),
        ("deny", _RET, None, None, eperm),
        ("enosys", _RET, None, None, enosys),
        ("kill", _RET, None, None, _RET_KILL_PROCESS),
    ]
    where = {label: i for i, (label, *_rest) in enumerate(body) if label}
    out = []
    for i, (_label, code, jt, jf, k) in enumerate(body):
        offsets = [0 if target in (None, "next") else where[target] - i - 1 for target in (jt, jf)]
        if not all(0 <= o < 256 for o in offsets):
            raise ValueError("seccomp program jump out of range")
        out.append((code, offsets[0], offsets[1], k))
    return out


_PREPARED: list = []  # the filter built once in the zygote, so its forks only install it


def _filter() -> tuple:
    if not _PREPARED:
        program = seccomp_program()
        raw = b"".join(struct.pack("=HBBI", *ins) for ins in program)
        buf = ctypes.create_string_buffer(raw, len(raw))
        _PREPARED.append((buf, _SockFprog(len(program), ctypes.cast(buf, ctypes.c_void_p))))
    return _PREPARED[0]


def seccomp_prepare() -> None:
    """Build the filter now (in the zygote), not in every program process."""
    if seccomp_supported():
        _filter()


def seccomp_install() -> None:
    """Install `seccomp_program` on this thread (sets no_new_privs, which a filter requires)."""
    _buf, fprog = _filter()
    no_new_privs()
    prctl_args = (ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.c_ulong(ctypes.addressof(fprog)), ctypes.c_ulong(0))
    _check(_libc.prctl(ctypes.c_int(PR_SET_SECCOMP), *prctl_args, ctypes.c_ulong(0)), "seccomp")
