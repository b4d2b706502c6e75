//! Property test: random sequences of appends, upserts, deletes by key and by position, full
//! rewrites and manifest rewrites against an in-memory model of the table. After every commit
//! our scan equals the model and the snapshot's `total-*` summary counts its live files; at
//! the end DuckDB agrees. Seeds are fixed so a failure replays;
//! `FLOE_MODEL_SEEDS` runs more.

mod support;

use std::collections::{BTreeMap, HashMap};

use floe_lake::commit::{RetryPolicy, commit_operation};
use floe_lake::manifests::RewriteManifests;
use floe_lake::rest::LoadedTable;
use floe_lake::snapshot::Delta;
use iceberg::spec::DataFile;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use support::common::{Harness, backends};
use support::{
    check, commit, create_table, live_totals, plan_full_rewrite, position_delete, scan,
    summary_totals, write_data, write_equality_deletes,
};

/// The model: live id → amount, and the files holding each id's live row.
#[derive(Default)]
struct Model {
    rows: BTreeMap<i64, f64>,
    home: HashMap<i64, Vec<DataFile>>,
}

impl Model {
    fn expected(&self) -> Vec<(i64, f64)> {
        self.rows.iter().map(|(k, v)| (*k, *v)).collect()
    }

    fn pick(&self, rng: &mut StdRng, n: usize) -> Vec<i64> {
        let keys: Vec<i64> = self.rows.keys().copied().collect();
        let mut picked: Vec<i64> = keys
            .choose_multiple(rng, n.min(keys.len()))
            .copied()
            .collect();
        picked.sort();
        picked
    }
}

async fn run(seed: u64, steps: usize) {
    let h = Harness::start(&backends()[0]).await;
    let client = support::client(&h, &h.catalog.uri()).await;
    let (ident, _) = create_table(&client, "model", &format!("seed{seed}")).await;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = Model::default();
    let mut next_id = 1i64;
    let policy = RetryPolicy::default();
    for step in 0..steps {
        let table: LoadedTable = client.load_table(&ident).await.unwrap();
        let amount = step as f64;
        let op = rng.random_range(0..10);
        let what = match op {
            0..=2 => {
                let ids: Vec<i64> = (next_id..next_id + rng.random_range(1..6)).collect();
                next_id += ids.len() as i64;
                let files = write_data(&table, &ids, amount).await;
                commit(
                    &client,
                    &ident,
                    Delta {
                        data_files: files.clone(),
                        ..Delta::default()
                    },
                )
                .await;
                for id in ids {
                    model.rows.insert(id, amount);
                    model.home.insert(id, files.clone());
                }
                "append"
            }
            3..=4 => {
                // Upsert: some existing keys and maybe a new one.
                let n = rng.random_range(1..4);
                let mut ids = model.pick(&mut rng, n);
                if rng.random_bool(0.5) {
                    ids.push(next_id);
                    next_id += 1;
                }
                let files = write_data(&table, &ids, amount).await;
                let delta = Delta {
                    data_files: files.clone(),
                    delete_files: write_equality_deletes(&table, &ids).await,
                    ..Delta::default()
                };
                commit(&client, &ident, delta).await;
                for id in ids {
                    model.rows.insert(id, amount);
                    model.home.insert(id, files.clone());
                }
                "upsert"
            }
            5 => {
                let n = rng.random_range(1..3);
                let ids = model.pick(&mut rng, n);
                if ids.is_empty() {
                    continue;
                }
                commit(
                    &client,
                    &ident,
                    Delta {
                        delete_files: write_equality_deletes(&table, &ids).await,
                        ..Delta::default()
                    },
                )
                .await;
                for id in ids {
                    model.rows.remove(&id);
                }
                "delete by key"
            }
            6 => {
                let ids = model.pick(&mut rng, 1);
                let Some(id) = ids.first() else { continue };
                let deletes = position_delete(&table, &model.home[id], *id).await;
                commit(
                    &client,
                    &ident,
                    Delta {
                        delete_files: deletes,
                        ..Delta::default()
                    },
                )
                .await;
                model.rows.remove(id);
                "delete by position"
            }
            7 => {
                if table.metadata.current_snapshot_id().is_none() {
                    continue;
                }
                let rewrite = plan_full_rewrite(&table).await;
                let outputs = rewrite.added_data_files.clone();
                commit_operation(&client, &ident, &rewrite, &policy)
                    .await
                    .unwrap();
                for id in model.rows.keys() {
                    model.home.insert(*id, outputs.clone());
                }
                "rewrite"
            }
            _ => {
                let merge = RewriteManifests {
                    target_bytes: 1 << 20,
                    min_manifests: 2,
                };
                commit_operation(&client, &ident, &merge, &policy)
                    .await
                    .unwrap();
                "rewrite manifests"
            }
        };
        let table = client.load_table(&ident).await.unwrap();
        assert_eq!(
            scan(&table).await,
            model.expected(),
            "seed {seed} step {step} ({what})"
        );
        if table.metadata.current_snapshot().is_some() {
            assert_eq!(
                summary_totals(&table),
                live_totals(&table).await,
                "seed {seed} step {step} ({what}): the snapshot's total-* properties"
            );
        }
    }
    let table = client.load_table(&ident).await.unwrap();
    check(
        &table,
        false,
        &model.expected(),
        &format!("seed {seed} at the end"),
    )
    .await;
    h.catalog.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_match_the_model() {
    let seeds: u64 = std::env::var("FLOE_MODEL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    for seed in 0..seeds {
        run(seed, 40).await;
    }
}
