#!/bin/sh
# HAProxy external check: $3 $4 are the server's address and port. grpc.health.v1 through maskctl
# (on PATH, see haproxy.cfg): exit 0 only when maskd.v1.MaskService is SERVING.
exec maskctl --server "$3:$4" --timeout 2 --connect-timeout 1 health >/dev/null 2>&1
