"""Fresh interpreters without the imports' cost: forked from one that has imported the package.

A test that starts an interpreter to run a command (a training run it kills,
workers of a cluster, a script of `examples/`) pays 5-9 CPU-s for its
imports (TensorFlow, Keras, the backend, keras_vit, matplotlib) before any
work, and the suite's tiny runs are short: a cold `keras-vit train` of two
4-step epochs took 13, 25 and 11 CPU-s on TensorFlow, JAX and PyTorch. Here,
a server process (the "zygote") imports what those
children import and nothing more: no backend is initialised in it (no
device, no thread pool, no compilation), so its forks start as a fresh
interpreter would after its imports, and run their command as `python -c` /
`-m` / a script would. A fork is a real process: it can be killed, it has
its own pid, standard streams, working folder, environment and exit code.

What a fork cannot have is an environment that its imports read: those
variables pick the server (one per set of values, shared by every process of
the run through the run's cache folder), and the variables that the
libraries read only when a backend starts (a cluster's addresses, JAX's
device count and compilation cache) are the request's own. Where the
interpreter's start is the subject (the console script's quiet start, an
import that must not happen, a file loaded by an interpreter that imported
nothing), tests start a cold one as before (`subprocess`).

`Popen` and `run` take the arguments of `subprocess.Popen` / `subprocess.run`
that the tests use, with `[sys.executable, ...]` as the command.
"""

import atexit
import builtins
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

# Read only when a backend or a cluster starts, or handled at the fork
# (JAX's compilation-cache settings): a request's own.
REQUEST_VARIABLES = (
    "TF_CONFIG",
    "XLA_FLAGS",
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
    "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "KERAS_DISTRIBUTION_PROCESS_ID",
    "PYTEST_CURRENT_TEST",
    "KERAS_VIT_TEST_CPU",
)
# What the children import before their work (the package's command line,
# its jobs, tf.data, the learning curves' and figures' matplotlib): the
# server's imports.
PRELOADED = (
    "tensorflow",
    "keras",
    "keras_vit",
    "keras_vit.cli",
    "keras_vit.data",
    "keras_vit.training",
    "keras_vit.training.train_job",
    "keras_vit.pretraining.pretrain_job",
    "keras_vit.distribution",
    "keras_vit.export",
    "keras_vit.inspect",
    "matplotlib.pyplot",
    "PIL.Image",
)
# A server with no request and no child for this long ends.
IDLE_SECONDS = 300
# The CPU seconds of the forks that this process started and saw end (a
# cold child's count in `resource.RUSAGE_CHILDREN`; the server reaps these).
CHILDREN_CPU = [0.0]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _key(environment):
    import_time = {k: v for k, v in environment.items() if k not in REQUEST_VARIABLES}
    return hashlib.sha1(json.dumps(sorted(import_time.items())).encode()).hexdigest()[:16]


def _folder():
    shared = os.environ.get("KERAS_VIT_TEST_CACHE")
    folder = os.path.join(shared, "warm_interpreters") if shared else _private_folder()
    os.makedirs(folder, exist_ok=True)
    return folder


_PRIVATE = []


def _private_folder():
    if not _PRIVATE:
        # (AF_UNIX paths are limited to 108 bytes: /tmp, not pytest's folders.)
        _PRIVATE.append(tempfile.mkdtemp(prefix="kv_warm_"))
        atexit.register(shutil.rmtree, _PRIVATE[0], ignore_errors=True)
    return _PRIVATE[0]


def _connect(environment):
    """A connection to the server for `environment`, started if none is up."""
    folder = _folder()
    key = _key(environment)
    address = os.path.join(folder, f"{key}.sock")
    with open(os.path.join(folder, f"{key}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        connection = _try_connect(address)
        if connection is None:
            _start_server(address, environment)
            connection = _try_connect(address, wait=120)
        if connection is None:
            raise RuntimeError(f"the warm interpreter at {address} did not start")
        return connection


def _try_connect(address, wait=0.0):
    deadline = time.time() + wait
    while True:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(address)
            return connection
        except (FileNotFoundError, ConnectionRefusedError):
            connection.close()
            if time.time() >= deadline:
                return None
            time.sleep(0.05)


def _start_server(address, environment):
    if os.path.exists(address):
        os.unlink(address)  # (a server that ended left it)
    server_environment = {k: v for k, v in environment.items() if k not in REQUEST_VARIABLES}
    log = open(address + ".log", "ab")
    # (It forks at once and its first process ends: the server is no child of
    # this process, so its forks' CPU is not counted again when it ends.)
    subprocess.run(
        [sys.executable, "-c", f"from tests.warm_interpreters import serve; serve({address!r})"],
        env=server_environment,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,  # a test's Ctrl-C or kill of its group never reaches it
    )
    log.close()
    if not os.environ.get("KERAS_VIT_TEST_CACHE"):
        # This process's own: it ends with it, and its forks with it. (The
        # run's shared ones are ended by `make test` when the suites are done:
        # `end_servers`.)
        atexit.register(_end, address[: -len(".sock")] + ".pid")


def _end(pid_file):
    """Ends the server whose process group `pid_file` names, and any fork still running."""
    try:
        with open(pid_file) as f:
            os.killpg(int(f.read()), signal.SIGKILL)
    except (OSError, ValueError):
        pass


def end_servers(folder):
    """Ends the servers (and their forks) that a run's processes started in `folder`."""
    folder = os.path.join(folder, "warm_interpreters")
    if not os.path.isdir(folder):
        return
    for name in os.listdir(folder):
        if name.endswith(".pid"):
            _end(os.path.join(folder, name))


def _fd(stream, mode):
    """`(fd, our end or None, to close after sending)` for a `subprocess`-style stream argument."""
    if stream is None:  # inherited, as subprocess does
        return {"r": 0, "w": 1}[mode], None, None
    if stream == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        return fd, None, fd
    if stream == subprocess.PIPE:
        read, write = os.pipe()
        if mode == "r":
            return read, os.fdopen(write, "wb"), read
        return write, os.fdopen(read, "rb"), write
    if hasattr(stream, "fileno"):
        return stream.fileno(), None, None
    return stream, None, None  # an fd


class Popen:
    """`subprocess.Popen` of `[sys.executable, "-c" CODE | "-m" MODULE | SCRIPT, *ARGS]`, warm."""

    def __init__(
        self, args, env=None, cwd=None, stdin=None, stdout=None, stderr=None, text=False, **_
    ):
        if not args or args[0] != sys.executable:
            raise ValueError(f"a warm interpreter runs Python only. Received: args={args!r}")
        environment = dict(os.environ if env is None else env)
        self.args, self.returncode, self.text = list(args), None, text
        ends = [_fd(stdin, "r"), _fd(stdout, "w")]
        if stderr == subprocess.STDOUT:
            ends.append((ends[1][0], None, None))
        else:
            ends.append(_fd(stderr, "w"))
        self.stdin, self.stdout, self.stderr = (end for _, end, _ in ends)
        self._connection = _connect(environment)
        request = json.dumps(
            {"argv": self.args[1:], "env": environment, "cwd": os.path.abspath(cwd or ".")}
        ).encode()
        # The request's length and the three descriptors, then the request.
        header = len(request).to_bytes(8, "big")
        socket.send_fds(self._connection, [header], [fd for fd, _, _ in ends])
        self._connection.sendall(request)
        for _, _, close in ends:
            if close is not None:
                os.close(close)
        self._received = b""
        line = self._line(timeout=None)
        if not line:
            raise RuntimeError("the warm interpreter closed the connection before forking")
        self.pid = json.loads(line)["pid"]

    def _line(self, timeout):
        """The server's next line, `b""` if it closed, `None` if none came within `timeout`."""
        import select

        deadline = None if timeout is None else time.time() + timeout
        while b"\n" not in self._received:
            left = None if deadline is None else max(0.0, deadline - time.time())
            ready, _, _ = select.select([self._connection], [], [], left)
            if not ready:
                return None
            chunk = self._connection.recv(4096)
            if not chunk:
                return b""
            self._received += chunk
        line, self._received = self._received.split(b"\n", 1)
        return line

    def poll(self):
        if self.returncode is None:
            line = self._line(timeout=0)
            if line is not None:
                self._finished(line)
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            line = self._line(timeout)
            if line is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._finished(line)
        return self.returncode

    def _finished(self, line):
        # (A server that ended without a word: its fork is gone too.)
        answer = json.loads(line) if line else {"returncode": -signal.SIGKILL}
        self.returncode = answer["returncode"]
        CHILDREN_CPU[0] += answer.get("cpu_seconds", 0.0)
        self._connection.close()

    def send_signal(self, signal_number):
        if self.returncode is None:
            try:
                os.kill(self.pid, signal_number)
            except ProcessLookupError:
                pass

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def communicate(self, input=None, timeout=None):
        if self.stdin is not None:
            if input:
                self.stdin.write(input.encode() if isinstance(input, str) else input)
            self.stdin.close()
        outputs = []
        for stream in (self.stdout, self.stderr):
            if stream is None:
                outputs.append(None)
                continue
            data = stream.read()  # (the fork's ends close when it ends)
            stream.close()
            outputs.append(data.decode(errors="replace") if self.text else data)
        self.wait(timeout)
        return tuple(outputs)


def run(args, capture_output=False, timeout=None, text=False, input=None, **options):
    """`subprocess.run` in a warm interpreter."""
    if capture_output:
        options.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if input is not None:
        options["stdin"] = subprocess.PIPE
    process = Popen(args, text=text, **options)
    if input is not None:
        process.stdin.write(input.encode() if isinstance(input, str) else input)
        process.stdin.close()
    try:
        stdout, stderr = _read_both(process, timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


def _read_both(process, timeout):
    import threading

    results = {}

    def read(name, stream):
        data = stream.read()
        stream.close()
        results[name] = data.decode(errors="replace") if process.text else data

    readers = [
        threading.Thread(target=read, args=(name, stream), daemon=True)
        for name, stream in (("stdout", process.stdout), ("stderr", process.stderr))
        if stream is not None
    ]
    for reader in readers:
        reader.start()
    process.wait(timeout)
    for reader in readers:
        reader.join()
    return results.get("stdout"), results.get("stderr")


# The server.


def serve(address):
    """Imports `PRELOADED`, then forks an interpreter for each request at `address`."""
    import importlib
    import select

    if os.fork():
        os._exit(0)
    for name in PRELOADED:
        importlib.import_module(name)
    if "jax" in sys.modules:
        from jax._src import xla_bridge

        assert not xla_bridge._backends, "a warm interpreter must not start JAX's backend"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    with open(address[: -len(".sock")] + ".pid", "w") as f:
        f.write(str(os.getpgid(0)))
    waiting = {}  # pid -> connection
    idle_since = time.time()
    while True:
        ready, _, _ = select.select([listener], [], [], 0.05)
        if ready:
            connection, _ = listener.accept()
            pid = _fork_request(listener, connection, waiting, address)
            if pid is None:
                connection.close()
            else:
                waiting[pid] = connection
        for pid in list(waiting):
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                connection = waiting.pop(pid)
                answer = {
                    "returncode": os.waitstatus_to_exitcode(status),
                    "cpu_seconds": usage.ru_utime + usage.ru_stime + _forks_cpu(address, pid),
                }
                try:
                    connection.sendall(json.dumps(answer).encode() + b"\n")
                except OSError:
                    pass
                connection.close()
        if waiting or ready:
            idle_since = time.time()
        elif time.time() - idle_since > IDLE_SECONDS:
            listener.close()
            os.unlink(address[: -len(".sock")] + ".pid")
            os.unlink(address)
            return


def _forks_cpu(address, pid):
    """The CPU seconds of the forks that fork `pid` started and saw end (it left them a file)."""
    path = f"{address}.{pid}.cpu"
    try:
        with open(path) as f:
            seconds = float(f.read())
    except (OSError, ValueError):
        return 0.0
    os.unlink(path)
    return seconds


def _fork_request(listener, connection, waiting, address):
    try:
        header, fds, _, _ = socket.recv_fds(connection, 8, 3)
        while len(header) < 8:
            header += connection.recv(8 - len(header))
        size, message = int.from_bytes(header, "big"), b""
        while len(message) < size:
            chunk = connection.recv(min(size - len(message), 1 << 20))
            if not chunk:
                raise OSError("the request ended early")
            message += chunk
        request = json.loads(message)
    except (OSError, ValueError):
        return None
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        return pid
    for held in (listener, connection, *waiting.values()):
        held.close()  # (the other requests' connections are the server's)
    # Out of the server's loop as the interpreter's own exit: exit handlers
    # (JAX's distributed shutdown) and buffered output as after `python -c`.
    code = _run_child(request, fds)
    if CHILDREN_CPU[0]:  # (forks it started itself: the server reaped them, not it)
        with open(f"{address}.{os.getpid()}.cpu", "w") as f:
            f.write(repr(CHILDREN_CPU[0]))
    sys.exit(code)


def _run_child(request, fds):
    """In the fork: become the interpreter the request names, and run it; its exit code."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", closefd=False, buffering=1 if os.isatty(1) else -1)
    sys.stderr = sys.__stderr__ = open(2, "w", closefd=False, buffering=1)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    _apply_request_settings()
    argv = request["argv"]
    code = 0
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            exec(
                compile(argv[1], "<string>", "exec"),
                {"__name__": "__main__", "__builtins__": builtins},
            )
        elif argv[0] == "-m":
            import runpy

            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            import runpy

            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit:
        code = exit.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        code = code or 0
    except BaseException:
        traceback.print_exc()
        code = 1
    return code


def _apply_request_settings():
    """JAX's compilation-cache settings, read from the environment when JAX was imported."""
    if "jax" not in sys.modules:
        return
    import jax

    environ = os.environ
    if "JAX_COMPILATION_CACHE_DIR" in environ:
        jax.config.update("jax_compilation_cache_dir", environ["JAX_COMPILATION_CACHE_DIR"])
    for name in ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",):
        if name in environ:
            jax.config.update(name.lower(), float(environ[name]))
    if "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES" in environ:
        jax.config.update(
            "jax_persistent_cache_min_entry_size_bytes",
            int(environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]),
        )
