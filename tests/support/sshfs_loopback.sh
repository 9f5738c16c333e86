#!/usr/bin/env bash
# A real network filesystem on one machine: sshd on 127.0.0.1 exporting a directory, mounted twice
# with sshfs (FUSE) so that two mounts act like two nodes (separate caches, flock local to a mount).
# tests/core/test_shared_sshfs.py runs the concurrency and fault tests there when the mounts exist.
#
#   sudo tests/support/sshfs_loopback.sh up      # needs root, packages: sshfs openssh-server openssh-client
#   sudo tests/support/sshfs_loopback.sh down
#   KC_SSHFS_ROOT (default /tmp/kc-sshfs) holds keys, the export and the mounts node-a, node-b.
set -euo pipefail

ROOT="${KC_SSHFS_ROOT:-/tmp/kc-sshfs}"
PORT="${KC_SSHFS_PORT:-2222}"
EXPORT="$ROOT/export"

up() {
  [ "$(id -u)" = 0 ] || { echo "sshfs_loopback: needs root (sshd, FUSE mounts)" >&2; exit 2; }
  for tool in sshfs ssh-keygen; do
    command -v "$tool" >/dev/null || { echo "sshfs_loopback: missing $tool (apt-get install sshfs openssh-server openssh-client)" >&2; exit 2; }
  done
  SSHD="$(command -v sshd || echo /usr/sbin/sshd)"
  [ -x "$SSHD" ] || { echo "sshfs_loopback: missing sshd (apt-get install openssh-server)" >&2; exit 2; }
  [ -e /dev/fuse ] || { echo "sshfs_loopback: no /dev/fuse" >&2; exit 2; }
  mkdir -p "$ROOT" "$EXPORT" "$ROOT/node-a" "$ROOT/node-b" /run/sshd
  chmod 700 "$ROOT"
  [ -f "$ROOT/host_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$ROOT/host_key"
  [ -f "$ROOT/client_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$ROOT/client_key"
  cp "$ROOT/client_key.pub" "$ROOT/authorized_keys"
  chmod 600 "$ROOT/authorized_keys"
  cat > "$ROOT/sshd_config" <<EOF
Port $PORT
ListenAddress 127.0.0.1
HostKey $ROOT/host_key
AuthorizedKeysFile $ROOT/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $ROOT/sshd.pid
Subsystem sftp internal-sftp
EOF
  if ! { [ -f "$ROOT/sshd.pid" ] && kill -0 "$(cat "$ROOT/sshd.pid")" 2>/dev/null; }; then
    "$SSHD" -f "$ROOT/sshd_config"
  fi
  for node in node-a node-b; do
    mountpoint -q "$ROOT/$node" && continue
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      sshfs -p "$PORT" \
        -o IdentityFile="$ROOT/client_key",StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR \
        "root@127.0.0.1:$EXPORT" "$ROOT/$node" && break
      sleep 0.5
    done
    mountpoint -q "$ROOT/$node" || { echo "sshfs_loopback: mounting $node failed" >&2; exit 1; }
  done
  echo "$ROOT/node-a $ROOT/node-b"
}

down() {
  for node in node-a node-b; do
    mountpoint -q "$ROOT/$node" 2>/dev/null && { fusermount -u "$ROOT/$node" 2>/dev/null || umount -l "$ROOT/$node"; }
  done
  if [ -f "$ROOT/sshd.pid" ]; then
    kill "$(cat "$ROOT/sshd.pid")" 2>/dev/null || true
    rm -f "$ROOT/sshd.pid"
  fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
