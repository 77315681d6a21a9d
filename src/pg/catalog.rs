//! Catalog lookups through PostgreSQL's syscache.

use pgrx::pg_sys;

/// Does the database with this OID exist (committed, as the catalog snapshot sees it)?
pub fn database_exists(oid: u32) -> bool {
    // SAFETY: SearchSysCacheExists only reads the syscache (keys by value, no pointers kept); it
    // is called on a backend's main thread inside a transaction (reconcile runs in one).
    unsafe {
        pg_sys::SearchSysCacheExists(
            pg_sys::SysCacheIdentifier::DATABASEOID as i32,
            pg_sys::Datum::from(pg_sys::Oid::from(oid)),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
        )
    }
}

/// Relation `relid`'s kind and whether it is a partition (`None`: no such relation).
fn class_of(relid: pg_sys::Oid) -> Option<(u8, bool)> {
    // SAFETY: a syscache lookup by value on the main thread inside a transaction; the tuple is
    // checked for NULL, read as the pg_class row a RELOID entry is, and released before return.
    unsafe {
        let tup = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::RELOID as i32,
            pg_sys::Datum::from(relid),
        );
        if tup.is_null() {
            return None;
        }
        let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_class>(tup);
        let class = ((*form).relkind as u8, (*form).relispartition);
        pg_sys::ReleaseSysCache(tup);
        Some(class)
    }
}

/// Is relation `relid` a partition that holds rows (a plain table attached to a partitioned one)?
pub fn is_leaf_partition(relid: pg_sys::Oid) -> bool {
    class_of(relid).is_some_and(|(kind, partition)| partition && kind == pg_sys::RELKIND_RELATION)
}

/// The OID of pg_fencing's own table `name` (in schema `_pg_fencing`; invalid if there is none).
pub fn internal_table(name: &std::ffi::CStr) -> pg_sys::Oid {
    // SAFETY: catalog lookups of NUL-terminated names inside a transaction; missing_ok, and
    // get_relname_relid returns InvalidOid for a missing relation.
    unsafe {
        let nsp = pg_sys::get_namespace_oid(c"_pg_fencing".as_ptr(), true);
        if nsp == pg_sys::InvalidOid {
            return pg_sys::InvalidOid;
        }
        pg_sys::get_relname_relid(name.as_ptr(), nsp)
    }
}

/// Is relation `relid` partitioned, or a partition (the tables a DROP of it may take rows of a
/// partition tree with)?
pub fn in_partition_tree(relid: pg_sys::Oid) -> bool {
    class_of(relid)
        .is_some_and(|(kind, partition)| partition || kind == pg_sys::RELKIND_PARTITIONED_TABLE)
}

/// Is extension pg_fencing created in this database?
pub fn extension_created() -> bool {
    // SAFETY: a catalog lookup of a NUL-terminated constant name inside a transaction;
    // missing_ok returns InvalidOid instead of raising.
    unsafe { pg_sys::get_extension_oid(c"pg_fencing".as_ptr(), true) != pg_sys::InvalidOid }
}
