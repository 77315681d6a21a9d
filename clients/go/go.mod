module github.com/pg-fencing/pg_fencing/clients/go

go 1.19

require (
	github.com/jackc/pgconn v1.11.0
	github.com/jackc/pgx/v4 v4.15.0
	github.com/lib/pq v1.10.7
	go.etcd.io/etcd v0.0.0-20221006105040-a5b7b8c1b4ba // etcd v3.4.23: its clientv3 and concurrency packages
)
