package floe.bench;

import io.opentelemetry.proto.common.v1.KeyValue;
import io.opentelemetry.proto.trace.v1.ResourceSpans;
import io.opentelemetry.proto.trace.v1.ScopeSpans;
import io.opentelemetry.proto.trace.v1.Span;
import io.opentelemetry.proto.trace.v1.TracesData;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.FlatMapFunction;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.table.api.Schema;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;

/**
 * The rollup baseline of Floe's windows benchmark: Flink SQL's {@code TUMBLE} over its Kafka
 * source — one-minute windows of spans per (service, span name, status) with count, mean and
 * maximum duration and distinct traces — on the RocksDB state backend with incremental
 * checkpoints every 10 s, written to an Iceberg table in Floe's REST catalog through Flink's
 * Iceberg SQL catalog. The source commits its offsets to the consumer group GROUP on every
 * checkpoint, which is how the harness sees that the job has consumed the topic.
 */
public final class FlinkRollupBench {
  public static void main(String[] args) throws Exception {
    if (args.length != 5) {
      System.err.println("usage: FlinkRollupBench BROKERS TOPIC CATALOG_URI TABLE GROUP");
      System.exit(2);
    }
    String brokers = args[0];
    String topic = args[1];
    String catalogUri = args[2];
    String table = args[3];
    String group = args[4];

    Path work = Files.createTempDirectory("floe-flink-rollup-");
    Configuration conf = new Configuration();
    conf.set(StateBackendOptions.STATE_BACKEND, "rocksdb");
    conf.set(CheckpointingOptions.INCREMENTAL_CHECKPOINTS, true);
    StreamExecutionEnvironment env = FlinkOtlpBench.localEnvironment(work, conf);
    StreamTableEnvironment tEnv = StreamTableEnvironment.create(env);

    KafkaSource<FlinkOtlpBench.KafkaValue> source =
        KafkaSource.<FlinkOtlpBench.KafkaValue>builder()
            .setBootstrapServers(brokers)
            .setTopics(topic)
            .setGroupId(group)
            .setStartingOffsets(OffsetsInitializer.earliest())
            .setDeserializer(new FlinkOtlpBench.KafkaValueDeserializer())
            .build();
    // Spans out of order by up to 10 s, as the Floe job's out_of_orderness.
    WatermarkStrategy<Row> watermarks =
        WatermarkStrategy.<Row>forBoundedOutOfOrderness(Duration.ofSeconds(10))
            .withTimestampAssigner((row, previous) -> ((Instant) row.getField(0)).toEpochMilli());
    DataStream<Row> spans =
        env.fromSource(source, WatermarkStrategy.noWatermarks(), "kafka-otlp")
            .flatMap(new SpanFields())
            .returns(
                Types.ROW_NAMED(
                    new String[] {
                      "ts", "service_name", "span_name", "status_code", "duration_ns", "trace_id"
                    },
                    Types.INSTANT,
                    Types.STRING,
                    Types.STRING,
                    Types.STRING,
                    Types.LONG,
                    Types.STRING))
            .name("span-fields")
            .assignTimestampsAndWatermarks(watermarks);
    tEnv.createTemporaryView(
        "spans",
        tEnv.fromDataStream(
            spans,
            Schema.newBuilder()
                .columnByMetadata("rowtime", "TIMESTAMP_LTZ(3)")
                .watermark("rowtime", "SOURCE_WATERMARK()")
                .build()));

    tEnv.executeSql(
        "CREATE CATALOG floe WITH ('type' = 'iceberg', 'catalog-type' = 'rest', 'uri' = '"
            + catalogUri
            + "')");
    tEnv.executeSql("CREATE DATABASE IF NOT EXISTS floe." + FlinkOtlpBench.NAMESPACE);
    String target = "floe." + FlinkOtlpBench.NAMESPACE + "." + table;
    tEnv.executeSql(
        "CREATE TABLE IF NOT EXISTS "
            + target
            + " (window_start TIMESTAMP(3), window_end TIMESTAMP(3), service_name STRING,"
            + " span_name STRING, status_code STRING, spans BIGINT, mean_ns DOUBLE,"
            + " slowest_ns BIGINT, traces BIGINT) WITH ('format-version' = '2')");
    System.err.printf(
        "flink-rollup-bench: %s/%s -> %s %s, RocksDB, checkpoints every %d ms in %s%n",
        brokers, topic, catalogUri, target, FlinkOtlpBench.CHECKPOINT_INTERVAL_MS, work.resolve("checkpoints"));
    tEnv.executeSql(
            "INSERT INTO "
                + target
                + " SELECT window_start, window_end, service_name, span_name, status_code,"
                + " COUNT(*), AVG(CAST(duration_ns AS DOUBLE)), MAX(duration_ns),"
                + " COUNT(DISTINCT trace_id)"
                + " FROM TABLE(TUMBLE(TABLE spans, DESCRIPTOR(rowtime), INTERVAL '1' MINUTE))"
                + " GROUP BY window_start, window_end, service_name, span_name, status_code")
        .await();
  }

  /** The columns the rollup reads, one row per span. */
  static final class SpanFields implements FlatMapFunction<FlinkOtlpBench.KafkaValue, Row> {
    private static final long serialVersionUID = 1L;

    @Override
    public void flatMap(FlinkOtlpBench.KafkaValue in, Collector<Row> out) throws Exception {
      TracesData data = TracesData.parseFrom(in.value);
      for (ResourceSpans rs : data.getResourceSpansList()) {
        String service = "unknown_service";
        for (KeyValue kv : rs.getResource().getAttributesList()) {
          if (kv.getKey().equals("service.name")) {
            service = kv.getValue().getStringValue();
          }
        }
        for (ScopeSpans ss : rs.getScopeSpansList()) {
          for (Span span : ss.getSpansList()) {
            long start = span.getStartTimeUnixNano();
            long end = span.getEndTimeUnixNano();
            out.collect(
                Row.of(
                    Instant.ofEpochSecond(0, start),
                    service,
                    span.getName(),
                    STATUSES[Math.min(Math.max(span.getStatus().getCodeValue(), 0), 2)],
                    Long.compareUnsigned(end, start) > 0 ? end - start : 0L,
                    FlinkOtlpBench.hexId(span.getTraceId()).toString()));
          }
        }
      }
    }

    private static final String[] STATUSES = {"UNSET", "OK", "ERROR"};
  }
}
