/work/main/fencing-core/target/debug/deps/pg_fencing_core-fe5167fd979b0b27.d: src/lib.rs src/json.rs src/token.rs

/work/main/fencing-core/target/debug/deps/pg_fencing_core-fe5167fd979b0b27: src/lib.rs src/json.rs src/token.rs

src/lib.rs:
src/json.rs:
src/token.rs:
