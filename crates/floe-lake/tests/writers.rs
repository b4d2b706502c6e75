//! The writers' contract: files roll at the target size even inside one large batch, the
//! partitioned writer caps its open files, two writer incarnations never produce the same file
//! name, files are zstd Parquet with the requested bloom filters, and every row lands in the
//! partition its values say.

mod support;

use std::collections::HashSet;

use floe_lake::writer::{DataWriter, WriterOptions};
use parquet::basic::Compression;
use parquet::file::reader::{FileReader, SerializedFileReader};
use support::common::{Harness, backends};
use support::{batch, create_table};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_roll_cap_and_never_reuse_names() {
    let h = Harness::start(&backends()[0]).await;
    let client = support::client(&h, &h.catalog.uri()).await;
    let (_, table) = create_table(&client, "writers", "t").await;
    let schema = table.metadata.current_schema().clone();

    // One batch of 200k rows in one partition (even ids are "us"), 256 KiB target: many files.
    let ids: Vec<i64> = (0..200_000).map(|i| i * 2).collect();
    let options = WriterOptions {
        target_file_size: 256 * 1024,
        bloom_filter_columns: vec!["id".into()],
        ..WriterOptions::default()
    };
    let mut writer = DataWriter::data(&table, &options).unwrap();
    writer.write(&batch(&schema, &ids, 1.0)).await.unwrap();
    let files = writer.close().await.unwrap();
    assert!(
        files.len() >= 4,
        "one large batch did not roll: {} files",
        files.len()
    );
    assert_eq!(files.iter().map(|f| f.record_count()).sum::<u64>(), 200_000);
    for file in &files {
        assert!(
            file.file_size_in_bytes() < 2 * 256 * 1024,
            "{} bytes",
            file.file_size_in_bytes()
        );
    }
    let bytes = table
        .io
        .new_input(files[0].file_path())
        .unwrap()
        .read()
        .await
        .unwrap();
    let reader = SerializedFileReader::new(bytes).unwrap();
    let row_group = reader.metadata().row_group(0);
    let id_column = row_group
        .columns()
        .iter()
        .find(|c| c.column_path().string() == "id")
        .unwrap();
    assert!(matches!(id_column.compression(), Compression::ZSTD(_)));
    assert!(
        id_column.bloom_filter_offset().is_some(),
        "no bloom filter on id"
    );
    assert!(id_column.statistics().is_some(), "no column statistics");

    // Many partitions (one per day), at most 3 open at once: still every row, in the right
    // partition, and each file holds a single partition.
    let capped = WriterOptions {
        max_open_files: 3,
        ..WriterOptions::default()
    };
    let mut writer = DataWriter::data(&table, &capped).unwrap();
    for round in 0..3 {
        // ts is day 19_700 + id µs → ids spread over 10 days with this stride.
        let ids: Vec<i64> = (0..10).map(|d| d * 86_400_000_000 + round).collect();
        writer.write(&batch(&schema, &ids, 1.0)).await.unwrap();
    }
    let files = writer.close().await.unwrap();
    assert_eq!(files.iter().map(|f| f.record_count()).sum::<u64>(), 30);
    let partitions: HashSet<String> = files
        .iter()
        .map(|f| format!("{:?}", f.partition()))
        .collect();
    assert_eq!(partitions.len(), 20, "10 days x 2 regions");

    // Rows grouped by partition (runs of a day and region, of different lengths) are split
    // as runs, and rows of mixed partitions row by row: either way each row lands in the
    // partition its values say.
    let groups: Vec<(i64, i64, i64)> = (0..4)
        .flat_map(|day| [(day, 0, 100 * (day + 1)), (day, 1, 50 * (day + 1))])
        .collect();
    let grouped: Vec<i64> = groups
        .iter()
        .flat_map(|&(day, parity, n)| (0..n).map(move |k| day * 86_400_000_000 + 2 * k + parity))
        .collect();
    let mut mixed = grouped.clone();
    mixed.sort_by_key(|id| (id % 2, id % 86_400_000_000, id / 86_400_000_000));
    for ids in [grouped, mixed] {
        let mut writer = DataWriter::data(&table, &WriterOptions::default()).unwrap();
        writer.write(&batch(&schema, &ids, 1.0)).await.unwrap();
        let files = writer.close().await.unwrap();
        for &(day, parity, n) in &groups {
            let (day, region) = (format!("Int({})", 19_700 + day), support::region(parity));
            let rows: u64 = files
                .iter()
                .filter(|f| {
                    let key = format!("{:?}", f.partition());
                    key.contains(&day) && key.contains(&format!("String(\"{region}\")"))
                })
                .map(|f| f.record_count())
                .sum();
            assert_eq!(rows, n as u64, "day {day} {region}");
        }
    }

    // Two incarnations with the same prefix write distinct names.
    let mut names = HashSet::new();
    for _ in 0..2 {
        let mut writer = DataWriter::data(&table, &WriterOptions::default()).unwrap();
        writer
            .write(&batch(&schema, &[1, 2, 3], 1.0))
            .await
            .unwrap();
        for file in writer.close().await.unwrap() {
            assert!(
                names.insert(file.file_path().to_string()),
                "name reused: {}",
                file.file_path()
            );
        }
    }
    h.catalog.stop().await.unwrap();
}
