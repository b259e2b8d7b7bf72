"""The sandbox: the one place model-written code runs, a Python program in a confined, limited process.

`run(Program(source, tests))` executes `source`, then each test snippet in the same namespace, and
returns a `SandboxResult` with one pass/fail per test; `run_many` runs a batch in parallel and keeps
the order; `isolation_report()` says which mechanisms this machine gives. How a program runs and
what each mechanism does: `textzoo.sandbox.host` (the parent's side) and `textzoo.sandbox._sandbox`
(the zygote and the program's side, standard library only). The sandbox imports nothing of textzoo
but `textzoo.errors`; tasks (`textzoo.envs`) import it, never the other way round.

What it guarantees
------------------
Each row: what model code may try, what stops it (the strongest mechanisms this machine allows are
used; `SandboxLimits.isolation` and `require` choose), what is left when those are missing, and the
tests that prove it (listed below the tables). For the network and the files each mechanism is
tested alone, against a control run without any isolation that does reach the listener, leave the
file and read the secret, so the tests can fail.

| model code tries to                      | stopped by                             | when those are missing   | tests |
| ---------------------------------------- | -------------------------------------- | ------------------------ | ----- |
| reach the network (127.0.0.1, any host)  | netns; seccomp; Landlock ABI>=4 (**)   | open                     | N     |
| leave files in /tmp, /dev/shm (shared)   | mountns (private tmpfs); Landlock      | world-writable dirs are  | F1    |
| read files outside its working dir       | mountns (only exposed paths); Landlock | its uid's files readable | F2    |
| write outside its working dir            | mountns read-only root; Landlock; uid  | its uid's files writable | F3    |
| escape: new namespaces, mount, ptrace    | seccomp                                | the other layers only    | E1    |
| escape: signal or ptrace the caller      | pidns; uid; Landlock scope; seccomp    | it can kill the caller   | E2    |
| escape: leave processes behind (daemons) | pidns; uid (kill -1 as that uid)       | they survive the run     | E3    |
| fork bomb                                | RLIMIT_NPROC (with uid or userns)      | timeout and RLIMIT_CPU   | L1    |
| loop, burn CPU                           | timeout_s (SIGKILL), RLIMIT_CPU        | (always on)              | L2    |
| exhaust memory or disk                   | RLIMIT_AS, RLIMIT_FSIZE, tmpfs size    | always on (tmpfs: mntns) | L3    |
| flood stdout/stderr                      | `output_bytes` kept, the rest dropped  | (always on)              | L4    |
| forge outcomes by printing               | nonce-tagged private pipe              | (always on)              | O1    |
| read the caller's environment or stdin   | scrubbed environment; stdin /dev/null  | (always on)              | O2    |
| run although a confinement step failed   | stops before model code; SandboxError  | always (fails closed)    | O3    |

(**) Landlock covers TCP only; UDP and raw sockets need netns or seccomp.

What it allows
--------------
| model code may                                                      | how                               | tests |
| ------------------------------------------------------------------- | --------------------------------- | ----- |
| import the whole standard library                                   | mountns binds the interpreter (*) | A1    |
| read and write its working dir, /tmp, /dev/shm (`disk_bytes`, gone) | one private tmpfs per program     | A2    |
| run its own processes and threads, signal its own process group     | RLIMIT_NPROC bounds; pidns ends   | A3    |
| sleep up to `timeout_s`, print up to `output_bytes`                 | wall clock, not CPU, is the limit | A4    |
| run for a non-root caller                                           | a user namespace stands for root  | A5    |

(*) with a dedicated uid but no private root, an interpreter in a private folder (under /root) can
only give the program the modules the zygote preloaded.

The tests (tests/test_sandbox.py; `code:` tests/test_code_env.py):

- N: test_each_network_layer_alone_blocks_a_local_connection (control:
  test_without_any_network_layer_the_connection_works); code: test_model_code_cannot_reach_the_network_or_leave_files
  (control: test_the_attacks_do_work_without_isolation).
- F1: test_each_file_layer_alone_keeps_tmp_and_shm_private; test_workdir_is_fresh_every_time.
- F2: test_each_file_layer_alone_hides_world_readable_files; test_cannot_read_user_files.
- F3: test_cannot_write_outside_workdir.
- E1: test_seccomp_blocks_new_namespaces_and_inet_sockets.
- E2: test_cannot_kill_parent; test_killing_own_process_group_spares_caller; test_pid_namespace_shows_only_the_program.
- E3: test_escaped_daemon_is_killed; test_close_kills_running_programs_and_the_zygote;
  test_zygote_and_programs_die_with_their_parent.
- L1: test_fork_bomb_is_bounded_and_cleaned_up. L2: test_infinite_loop_times_out; test_cpu_limit_kills_busy_program;
  test_looping_test_costs_only_itself. L3: test_huge_allocation_fails; test_private_tmpfs_is_bounded_by_disk_bytes.
  L4: test_output_flood_is_truncated.
- O1: test_forged_result_lines_are_ignored. O2: test_stdin_is_empty_and_env_is_scrubbed.
  O3: test_a_failed_setup_step_raises_and_runs_no_model_code; test_require_refuses_a_missing_mechanism.
- A1: test_the_whole_standard_library_imports; code: test_standard_library_imports_do_not_cost_the_reward.
  A2: test_workdir_is_fresh_every_time. A3: test_killing_own_process_group_spares_caller.
  A4: test_a_sleeping_program_takes_its_time; test_per_test_outcomes_and_output.
  A5: test_non_root_callers_get_user_namespaces_and_are_told (it runs as `nobody` and skips where a
  non-root user gets no user namespace). Tests of a mechanism this machine lacks skip and say which.

What is not guaranteed
----------------------
- Results are reported from inside the program's process: code that introspects the harness
  (frames, `gc`) could find the nonce and forge outcomes, just as it could monkeypatch `==`.
- The kernel is shared: a kernel bug reachable from the allowed system calls breaks every layer.
- Every program of one zygote shares its hash seed and preloaded modules' initial state (`random`
  is reseeded per program).
- The exposed paths (system libraries, the interpreter's folders, including its own site-packages
  but not a virtualenv's) are readable; they are world-readable system files.
- Without netns, Landlock ABI >= 4 and seccomp (another architecture, an old kernel), the network
  is open; without mountns and Landlock, /tmp is shared and the user's files readable; without
  root or user namespaces, there is no pid namespace and no private uid: the limits, Landlock and
  seccomp are all that apply. `isolation_report()` says what this machine gives.
"""

from textzoo.sandbox.host import (
    ISOLATION,
    IsolationReport,
    Program,
    SandboxLimits,
    SandboxResult,
    can_drop_privileges,
    close_zygotes,
    isolation_report,
    run,
    run_many,
)

__all__ = [
    "ISOLATION",
    "IsolationReport",
    "Program",
    "SandboxLimits",
    "SandboxResult",
    "can_drop_privileges",
    "close_zygotes",
    "isolation_report",
    "run",
    "run_many",
]
