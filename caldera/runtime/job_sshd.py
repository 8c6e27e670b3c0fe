"""The SSH server of one ``caldera ssh`` connection, started inside a job as the job's user: the SSH stream is
this process's stdin and stdout, the way ``sshd -i`` serves one connection from inetd.

The platform's relay (``caldera.server.ssh_relay``) starts it through ``Runtime.exec`` for each connection, so it
has the job's uid, namespaces and files, and nothing more: it listens on no port, and no other job or user can
reach it. The relay hands it, as its arguments, the owner's SSH public keys as the platform holds them at that
moment (a key removed stops new sessions), and it accepts only those (no password, no keyboard-interactive). Its
host key is made on first use, 0600, in the owner's own space (``~/.config/caldera/``), so ``known_hosts`` stays
true across connections, jobs and the two servers below.

Which server: **OpenSSH's** ``sshd -i`` where the job's root has ``/usr/sbin/sshd``, ``ssh-keygen`` and nss_wrapper
(``libnss_wrapper.so``), else **asyncssh**'s (``caldera.runtime.job_asyncssh``, whose source the relay passes
along). sshd runs as the job's uid, which can log in only as itself, and takes the login's passwd entry for its
home and shell: the platform's job accounts have the home ``/nonexistent`` and the shell ``nologin``. nss_wrapper
shows sshd alone (not the session it starts) a passwd file of this connection's: the login name ``caldera``
(``caldera ssh-config``'s ``User``) and the account's own name, both the job's uid, with the job's HOME and bash
(else sh). That file, the keys' file and sshd's config are written here, 0600 in a 0700 directory of this
connection, and what goes into them is checked: a key is written only as ``type base64``, once its blob decoded to
that type; a path or an environment variable goes into the config only when made of ``[A-Za-z0-9_./@+,=-]`` (else
the variable is left out, and a path means asyncssh's server).

Standard library only: its source is handed to the job's Python with ``-c``.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import glob
import os
import pwd
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

OPENSSH_SERVER = "/usr/sbin/sshd"
SSH_USER = "caldera"  # the login name caldera ssh and caldera ssh-config send
_NSS_WRAPPER = ("/usr/lib/*/libnss_wrapper.so", "/usr/lib64/libnss_wrapper.so", "/usr/lib/libnss_wrapper.so")
_KEY_TYPES = frozenset(
    {"ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
     "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com"}
)  # fmt: skip
_SAFE = re.compile(r"[A-Za-z0-9_./@+,=-]+")  # no space, quote, %, #, newline: nothing sshd's parser reads
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SESSION_OWN = frozenset({"HOME", "USER", "LOGNAME", "SHELL", "MAIL", "PWD", "OLDPWD", "SHLVL", "_", "TERM"})
_NOT_PASSED = ("SSH_", "LD_", "NSS_WRAPPER_")  # sshd's, the loader's, the wrapper's: never from the job's env
_CONFIG = """\
HostKey {host_key}
AuthorizedKeysFile {dir}/authorized_keys
AuthorizedKeysCommand none
AuthorizedPrincipalsFile none
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
GSSAPIAuthentication no
UsePAM no
PermitRootLogin no
PermitUserEnvironment no
PermitTunnel no
X11Forwarding no
AllowAgentForwarding no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
StrictModes no
PidFile none
PrintMotd no
PrintLastLog no
UseDNS no
Subsystem sftp internal-sftp
"""
# StrictModes no: sshd would refuse keys under a world-writable /tmp; this directory is 0700 and made here.
# AllowTcpForwarding, AllowStreamLocalForwarding: inside the job, as its user (VSCode Remote-SSH needs them).


def public_keys(text: str) -> list[str]:
    """Each line of ``text`` that is an OpenSSH public key, as ``type base64`` (options and comment dropped)."""
    keys = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2 or fields[0] not in _KEY_TYPES:
            continue
        try:
            blob = base64.b64decode(fields[1], validate=True)
        except binascii.Error:
            continue
        if len(blob) < 4 or blob[4 : 4 + struct.unpack(">I", blob[:4])[0]] != fields[0].encode():
            continue
        keys.append(f"{fields[0]} {fields[1]}")
    return keys


def _nss_wrapper() -> str | None:
    for pattern in _NSS_WRAPPER:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def _safe(value: str) -> bool:
    return _SAFE.fullmatch(value) is not None


def _host_key(path: str, keygen: str) -> None:
    """An ed25519 host key at ``path``, 0600, made with ssh-keygen unless one is there (asyncssh's reads the same)."""
    if os.path.exists(path):
        return
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fresh = f"{path}.{os.getpid()}"
    try:
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", fresh], check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        os.link(fresh, path)  # never over a key a connection beside this one made first
    except FileExistsError:
        pass
    finally:
        for leftover in (fresh, f"{fresh}.pub"):
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass


def _connection_dir() -> str:
    """A fresh 0700 directory named after this process (which becomes sshd), once those of connections gone
    (their process gone from this PID namespace) are removed."""
    tmp = tempfile.gettempdir()
    prefix = "caldera-sshd-" + re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) + "-"
    for name in os.listdir(tmp):
        pid = name[len(prefix) :].split("-")[0]
        if not name.startswith(prefix) or not pid.isdigit():
            continue
        path = os.path.join(tmp, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:  # a connection beside this one removed it
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=tmp)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _passed_env() -> str:
    """The job's environment for sshd's sessions (sshd starts them from a clean one): variables whose name and
    value are safe in a config line, less those sshd sets itself."""
    passed = [
        f"{name}={value}"
        for name, value in sorted(os.environ.items())
        if _ENV_NAME.fullmatch(name) and _safe(value) and name not in _SESSION_OWN and not name.startswith(_NOT_PASSED)
    ]
    return f"SetEnv {' '.join(passed)}\n" if passed else ""  # sshd keeps only a config's first SetEnv line


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _accounts(directory: str, home: str, shell: str) -> None:
    """nss_wrapper's passwd and group files: ``caldera`` and the account's own name, the job's uid and gid."""
    uid, gid = os.getuid(), os.getgid()
    names = [SSH_USER]
    try:
        own = pwd.getpwuid(uid).pw_name
        if own != SSH_USER and _safe(own) and ":" not in own:
            names.append(own)
    except KeyError:  # a container's uid without a passwd entry
        pass
    _write(f"{directory}/passwd", "".join(f"{n}:x:{uid}:{gid}:Caldera job:{home}:{shell}\n" for n in names))
    _write(f"{directory}/group", f"{SSH_USER}:x:{gid}:\n")


def openssh(keys: list[str], host_key: str) -> None:
    """Exec OpenSSH's ``sshd -i`` for this connection, or return where the job has none (or a path is unsafe)."""
    wrapper, keygen = _nss_wrapper(), shutil.which("ssh-keygen")
    home = os.environ.get("HOME") or "/"
    shell = shutil.which("bash") or "/bin/sh"
    if not (os.access(OPENSSH_SERVER, os.X_OK) and wrapper and keygen):
        return
    if not all(_safe(p) and p.startswith("/") for p in (home, shell, host_key, tempfile.gettempdir())):
        return
    _host_key(host_key, keygen)
    directory = _connection_dir()
    _write(f"{directory}/authorized_keys", "".join(f"{key}\n" for key in keys))
    _accounts(directory, home, shell)
    _write(f"{directory}/sshd_config", _CONFIG.format(host_key=host_key, dir=directory) + _passed_env())
    env = {**os.environ, "LD_PRELOAD": wrapper, "NSS_WRAPPER_PASSWD": f"{directory}/passwd",
           "NSS_WRAPPER_GROUP": f"{directory}/group"}  # fmt: skip
    os.execve(OPENSSH_SERVER, [OPENSSH_SERVER, "-i", "-f", f"{directory}/sshd_config"], env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="caldera-job-sshd")
    ap.add_argument("--authorized-keys", required=True, help="the owner's public keys, one OpenSSH line each")
    ap.add_argument("--host-key", default=os.path.expanduser("~/.config/caldera/ssh_host_ed25519_key"))
    ap.add_argument("--server", choices=("auto", "asyncssh"), default="auto", help="auto: OpenSSH's where there")
    ap.add_argument("--asyncssh-source", required=True, help="caldera.runtime.job_asyncssh's source")
    args = ap.parse_args(argv)
    try:
        os.chdir(os.path.expanduser("~"))  # where scp's and sftp's relative paths start, as with OpenSSH
    except OSError:
        pass
    keys = public_keys(args.authorized_keys)
    if args.server == "auto":
        try:
            openssh(keys, args.host_key)
        except (OSError, subprocess.CalledProcessError) as exc:  # then asyncssh's server, which says its own
            print(f"caldera job sshd: OpenSSH's server not started: {exc}", file=sys.stderr)
    argv = ["-c", args.asyncssh_source, "--authorized-keys", "\n".join(keys), "--host-key", args.host_key]
    os.execv(sys.executable, [sys.executable, *argv])
    return 1  # not reached: execv returns only by raising


if __name__ == "__main__":
    sys.exit(main())
