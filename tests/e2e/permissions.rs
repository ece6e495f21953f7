//! What the README promises about database privileges: once an owner has migrated, a user
//! with row privileges only can run the host (no DDL at start-up), and that user really
//! cannot create tables.

use std::sync::Arc;

use outbox_host::store::{Mark, Outcome, Status, Store, now_ms};

use crate::support::{TestDb, World};

#[tokio::test]
async fn postgres_host_runs_with_row_privileges_only() {
    let Some(db) = TestDb::postgres().await else { return };
    let world = World::on(db).await;
    let (schema, role) = (world.db.name(), format!("{}_app", world.db.name()));
    let owner = sqlx::PgPool::connect(&world.db.url).await.unwrap();
    for sql in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("GRANT USAGE ON SCHEMA {schema} TO {role}"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}"),
    ] {
        sqlx::query(&sql).execute(&owner).await.unwrap();
    }
    let url = world.db.url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    assert_ne!(url, world.db.url, "TEST_POSTGRES_URL is expected to connect as postgres@");
    row_privileges_suffice(&world, &url).await;
    for sql in [format!("DROP OWNED BY {role}"), format!("DROP ROLE {role}")] {
        sqlx::query(&sql).execute(&owner).await.unwrap();
    }
    owner.close().await;
}

#[tokio::test]
async fn mysql_host_runs_with_row_privileges_only() {
    let Some(db) = TestDb::mysql().await else { return };
    let world = World::on(db).await;
    let (database, user) = (world.db.name(), world.db.name());
    let root = sqlx::MySqlPool::connect(&world.db.url).await.unwrap();
    for host in ["%", "localhost", "127.0.0.1"] {
        sqlx::query(&format!("CREATE USER '{user}'@'{host}'")).execute(&root).await.unwrap();
        sqlx::query(&format!("GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE ON {database}.* TO '{user}'@'{host}'"))
            .execute(&root)
            .await
            .unwrap();
    }
    let url = world.db.url.replacen("mysql://root@", &format!("mysql://{user}@"), 1);
    assert_ne!(url, world.db.url, "TEST_MYSQL_URL is expected to connect as root@");
    row_privileges_suffice(&world, &url).await;
    for host in ["%", "localhost", "127.0.0.1"] {
        sqlx::query(&format!("DROP USER '{user}'@'{host}'")).execute(&root).await.unwrap();
    }
    root.close().await;
}

async fn row_privileges_suffice(world: &World, url: &str) {
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let app: Arc<dyn Store> = outbox_host::store::open(url, 2, "room_outbox").await.unwrap();
    app.migrate().await.expect("an up-to-date schema needs no DDL");
    let now = now_ms();
    let claimed = app.claim("w", now, now + 60_000, 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let mark = Mark::of(&claimed[0], Outcome::Delivered);
    assert_eq!(app.mark(&[mark], now).await.unwrap(), 1);
    assert_eq!(app.get(&id).await.unwrap().unwrap().status, Status::Delivered);
    app.insert(&[world.event("RoomGiftSent", "room-1", Status::Pending)])
        .await
        .expect("a producer with row privileges inserts");

    let other: Arc<dyn Store> = outbox_host::store::open(url, 2, "other_outbox").await.unwrap();
    assert!(other.migrate().await.is_err(), "this user could create tables: the test proves nothing");
    app.close().await;
    other.close().await;
}
