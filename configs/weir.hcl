# weir configuration: one file for `weir up`, every service and the CLI.
#
# Every setting is optional; the value shown is the default, except where a
# comment says "differs from the default". Flags override the file, and the
# file overrides the defaults: --data, --run-dir, --log-level, --log-format,
# --nats-url, --nats-namespace.
#
# Relative paths are relative to the directory holding this file.
# Durations are strings: "500us", "5ms", "2s", "1m".
# Sizes are a number of bytes or a string with a binary unit: 4096, "64KiB",
# "8MiB", "1GiB".

# Where weir keeps its data: metadata WAL and checkpoints, blobs, staging,
# the NATS credentials. Created mode 0700: only the service user may enter
# it. `weir up --data DIR` overrides it.
data_dir = "/var/lib/weir"

# Directory of the Unix sockets clients connect to, and of nats.url. It
# must be reachable by every user, so it cannot be inside data_dir.
# Default: /run/weir for the default data_dir, "<data_dir>.run" beside any
# other, so it follows --data unless set here; --run-dir overrides it.
# run_dir = "/run/weir"

# trace, debug, info, warn or error.
log_level = "info"

# text (human) or json (one object per line).
log_format = "text"

# Control plane: health, stats, leases, verification jobs. NATS never
# carries file data or namespace requests.
nats {
  # Empty: `weir up` starts an embedded server in its own process.
  # Otherwise the URL (or comma-separated URLs) of an external cluster,
  # e.g. "nats://10.0.0.5:4222,nats://10.0.0.6:4222".
  url = ""

  # Address of the embedded server; loopback only. Port -1 or 0 picks a
  # random free port.
  # Differs from the default "127.0.0.1:-1": a fixed port lets `weir status`
  # and the nats CLI in another shell find the server.
  listen = "127.0.0.1:4222"

  # How long one connection attempt may take. After the first connection,
  # processes reconnect forever with backoff.
  connect_timeout = "5s"

  # How long a service waits for another's answer to a control request (a
  # grant, a revocation, a size report). A service that is gone is noticed
  # at once, through the services' own session, without waiting for this.
  request_timeout = "5s"

  # The stack's credentials: one nkey seed per role (metadata, io,
  # journal, verifier, cli), 0600 in a 0700 directory, created on first
  # start. Every NATS connection authenticates with one; `weir status` and
  # the other CLI commands use cli's, so they run as the service user.
  # `weir nats-config` prints what an external server needs. Default:
  # <data_dir>/creds.
  # creds_dir = "/var/lib/weir/creds"

  # Starts every NATS subject of this stack ("<namespace>.io.grant", ...)
  # and the group of its health and stats endpoints, and is what
  # `weir status` looks for: stacks that share a NATS server (one external
  # cluster, say) must each have their own, or one stack answers the
  # other's control requests. Tokens of letters, digits, '-' and '_',
  # separated by dots ("prod.host-7"); no wildcards or spaces; at most 64
  # bytes. Every process of a stack reads it from this file; --nats-namespace
  # overrides it (weir up passes its value on to the services).
  namespace = "weir"
}

metadata {
  # Socket clients connect to for namespace requests. Default:
  # <run_dir>/metadata.sock, so it follows run_dir unless set here.
  # socket = "/run/weir/metadata.sock"

  # Socket the stack's other services (io) keep their service session on:
  # 0600, the service user only. Default: <run_dir>/metadata.svc.sock.
  # service_socket = "/run/weir/metadata.svc.sock"

  # After a start, how long files that were unlinked while open are kept
  # for their holders, whose clients reopen them, before they are freed.
  reclaim_grace = "30s"

  # true: every namespace mutation (create, mkdir, rename, unlink, chmod,
  # ...) is durable when its reply is sent; concurrent mutations share one
  # WAL fsync. false (default, as ext4 and XFS behave): a reply is sent once
  # the record is in the WAL file (it survives a SIGKILL of any service),
  # and the WAL is fsynced every sync_interval and at every fsync of a file
  # or directory, which makes all earlier mutations durable. A power loss
  # can lose at most sync_interval of mutations nobody fsynced.
  sync_every_op = false

  # Group-commit interval when sync_every_op is false.
  sync_interval = "5ms"

  # WAL records between metadata checkpoints (snapshot, then WAL trim),
  # or a quarter of the files and directories the last checkpoint held if
  # that is more (a snapshot costs in proportion to the namespace).
  checkpoint_every = 10000

  # Trust groups: sessions that share a file's leases without checks. A
  # write grant is its group's exclusive lease of the file; a grant of
  # another group that conflicts with it is recalled (revoked at io) first.
  # "uid" (default): the processes of one user, who can already ptrace
  # each other. "process": each process alone (strict). "session": each
  # client session alone.
  trust_groups = "uid"

  # Named groups put uids into one trust group whatever the mode above.
  # named_trust_groups = { builders = [1001, 1002] }

  # How long a protected grant is safe from another trust group's recall
  # (the recaller waits out the rest). A grant is protected when its
  # holder's last one was recalled before it served a request, so that two
  # groups cannot take a file from each other forever with nothing served.
  # "0s": no protection. At most "1s".
  lease_min_tenure = "250us"
}

io {
  # Socket clients connect to for reads and writes. Default:
  # <run_dir>/io.sock, so it follows run_dir unless set here.
  # socket = "/run/weir/io.sock"

  # file: blobs under data_dir. mem: in memory, lost on exit (tests only).
  # spdk: SPDK Blobstore on the bdev spdk_bdev, which the SPDK JSON
  # configuration spdk_config creates (NVMe, aio, uring or malloc); only in
  # a weir built with the spdk tag (make spdk).
  backend = "file"

  # For backend = "spdk": the SPDK JSON configuration and the bdev.
  # spdk_config = "/etc/weir/spdk.json"
  # spdk_bdev   = "Nvme0n1"
  # Run SPDK on ordinary memory instead of huge pages (tests only: no DMA
  # to real devices), and its memory size in MiB (0: SPDK's default).
  # spdk_no_huge = false
  # spdk_mem_mb  = 0
  # Cluster (allocation unit) of a new blobstore: 0 is SPDK's 1MiB.
  # spdk_cluster_size = 0
  # I/O workers: polling threads, each with its own SPDK thread and I/O
  # channel. One keeps many I/Os in flight; the next joins when the first
  # has 16 outstanding. Each polls a core while it has work.
  # spdk_workers = 1

  # O_DIRECT for the file backend: auto uses it where the file system
  # allows, on requires it (start fails otherwise), off never uses it.
  direct = "auto"

  # How session pollers wait for requests: adaptive spins briefly then
  # sleeps on the doorbell; busy-poll never sleeps (a pinned core each).
  wait_mode = "adaptive"

  # The page cache in shared memory (docs/cache-abi.md): at most this many
  # bytes of file pages stay resident across all open files (the least
  # recently filled, not recently used clean pages are evicted past it).
  # 0 turns the cache off: every read and write goes to the device.
  cache_size = "1GiB"

  # The largest window a sequential reader's cache misses fill ahead of
  # what it asked (it starts at 16KiB and doubles per sequential miss);
  # random access resets it. 0 turns readahead off.
  readahead = "512KiB"

  # Descriptors io keeps for files nobody has open: the cache regions of
  # closed files (two memfds each: their pages stay cached) and idle blob
  # files, given back least recently used first, and at once when the
  # kernel refuses a descriptor. io's descriptors then grow with the files
  # open now, not with every file ever touched. At most a quarter of io's
  # RLIMIT_NOFILE; 64 to 1048576.
  descriptors = 1536

  # The staging log of fsync (Split Journaling, docs/journal-format.md): an
  # fsync writes the file's changed pages and size to it as one record and
  # returns after one device flush; a checkpoint writes them home in the
  # background and frees the room. Made at the first start of a store (an
  # existing log keeps its size). When it is full, fsyncs wait for room.
  # 0 turns it off: fsync syncs the file, the store and the metadata WAL,
  # and a truncate that shrinks a file syncs its new size into the metadata
  # WAL before the cut.
  staging_size = "64MiB"
}

# The journal service (Split Journaling): it checkpoints the staging log in
# the background, pass after pass: io writes the files' pages home, the
# metadata service commits their sizes and mtimes in one WAL record, io
# trims the log. While it is down, fsync goes on until the log is full and
# then waits for it (weir status says so).
journal {
  # Run the journal service; false makes io checkpoint the log itself.
  enabled = true

  # The IO service's socket the journal service opens its session on
  # (0600, the service user only). Default: <run_dir>/io.journal.sock.
  # socket = "/run/weir/io.journal.sock"

  # The longest a pass waits when nothing asks for one (1ms to 1s).
  interval = "200ms"

  # Ablation of the benchmark: every fsync waits until its record is
  # checkpointed ("no background journaling"). Not for production.
  foreground = false
}

# What the clients of one uid may take of the services, so that no local
# user can take the stack from the others (docs/architecture.md, "Limits per
# uid"). A count of 0 is no bound; a share is a percentage (1 to 100) of
# the resource, 100 leaving only the service's own bound. Refusals are
# counted in `weir status` (limits_refused_*, limits_*).
limits {
  # Uids no limit applies to (the services' own uid always is): root can
  # stop the services anyway.
  exempt_uids = [0]

  # Connections of one uid (and of all uids) still in the ring's handshake
  # (accepted, the session's memory made, the client's ack awaited), per
  # service socket; past either a connection is refused: the client's dial
  # fails with EAGAIN.
  handshakes_per_uid = 8
  handshakes         = 64

  # A connection that has not completed the handshake by then is dropped
  # (100ms to 1m).
  handshake_timeout = "2s"

  # Ring sessions (each client process has one per service) of one uid and
  # of all uids, per service; past either a connection is refused: the
  # client's dial fails with EUSERS. Each session a service serves holds a
  # poller, and an OS thread while it sleeps.
  sessions_per_uid = 256
  sessions         = 4096

  # The part of io's pinned cache pages (MAP_SHARED mappings of weir files:
  # half the cache; the shim's write windows: a quarter) one uid's sessions
  # may hold; past it a map (or a window) is ENOMEM.
  pins_share = 50

  # The part of the staging log one uid's fsyncs may hold in records not
  # yet checkpointed; past it the uid's fsyncs make the file durable at
  # home instead (slower, but they take no room from other users' fsyncs).
  staging_share = 50

  # The part of the metadata service's kept read leases (4096) one uid's
  # sessions may keep; past it that uid's least recently used ones end
  # (its next opens of those files ask io for a grant again).
  leases_share = 25

  # The part of io's descriptors (its RLIMIT_NOFILE, counted at three per
  # open file: the blob's and its cache region's two) the grants of one
  # uid's sessions may hold; past it an open's first read or write fails
  # with EMFILE.
  descriptors_share = 25
}

# Shape of the shared-memory rings created for each client session.
ring {
  # Submission queue slots: a power of two from 2 to 32768. The completion
  # queue gets twice as many.
  sq_entries = 256

  # Payload arena per session: at least two blocks, below 4GiB.
  arena_size = "8MiB"

  # Arena allocation unit: a power of two from 64 B to 1 MiB.
  block_size = "4KiB"
}
