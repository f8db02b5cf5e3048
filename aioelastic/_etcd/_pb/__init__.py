"""Generated protobuf messages for etcd's v3 API (see scripts/gen_etcd_protos.py). Do not edit."""
