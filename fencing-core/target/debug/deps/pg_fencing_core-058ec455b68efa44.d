/work/main/fencing-core/target/debug/deps/pg_fencing_core-058ec455b68efa44.d: src/lib.rs src/json.rs src/token.rs

/work/main/fencing-core/target/debug/deps/libpg_fencing_core-058ec455b68efa44.rlib: src/lib.rs src/json.rs src/token.rs

/work/main/fencing-core/target/debug/deps/libpg_fencing_core-058ec455b68efa44.rmeta: src/lib.rs src/json.rs src/token.rs

src/lib.rs:
src/json.rs:
src/token.rs:
