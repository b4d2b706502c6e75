package floe.bench;

import com.google.protobuf.ByteString;
import io.opentelemetry.proto.common.v1.AnyValue;
import io.opentelemetry.proto.common.v1.InstrumentationScope;
import io.opentelemetry.proto.common.v1.KeyValue;
import io.opentelemetry.proto.resource.v1.Resource;
import io.opentelemetry.proto.trace.v1.ResourceSpans;
import io.opentelemetry.proto.trace.v1.ScopeSpans;
import io.opentelemetry.proto.trace.v1.Span;
import io.opentelemetry.proto.trace.v1.Status;
import io.opentelemetry.proto.trace.v1.TracesData;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.stream.Stream;
import java.time.Instant;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import org.apache.flink.api.common.functions.FlatMapFunction;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.CoreOptions;
import org.apache.flink.configuration.WebOptions;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.table.data.GenericArrayData;
import org.apache.flink.table.data.GenericMapData;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.data.TimestampData;
import org.apache.flink.table.runtime.typeutils.InternalTypeInfo;
import org.apache.flink.table.types.logical.RowType;
import org.apache.flink.util.Collector;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.Schema;
import org.apache.iceberg.TableProperties;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.catalog.Namespace;
import org.apache.iceberg.catalog.SupportsNamespaces;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.flink.CatalogLoader;
import org.apache.iceberg.flink.FlinkSchemaUtil;
import org.apache.iceberg.flink.TableLoader;
import org.apache.iceberg.flink.sink.FlinkSink;
import org.apache.iceberg.types.Type;
import org.apache.iceberg.types.Types;
import org.apache.kafka.clients.consumer.ConsumerRecord;

/**
 * The Apache Flink baseline of Floe's OTLP benchmark.
 *
 * <p>Reads Kafka records whose values are protobuf {@code TracesData}, flattens them to one row
 * per span in the same shape as Floe's spans table, and appends them to an Iceberg table through
 * the Iceberg Flink sink, which commits on every checkpoint (every 10 s). Runs in an in-process
 * MiniCluster until killed.
 *
 * <p>Usage: {@code FlinkOtlpBench BROKERS TOPIC CATALOG_URI TABLE}; the table is created as
 * {@code flinkbench.TABLE} in the REST catalog at CATALOG_URI.
 */
public final class FlinkOtlpBench {
  static final String NAMESPACE = "flinkbench";
  static final int PARALLELISM = 2;
  static final long CHECKPOINT_INTERVAL_MS = 10_000;

  private FlinkOtlpBench() {}

  public static void main(String[] args) throws Exception {
    if (args.length != 4) {
      System.err.println("usage: FlinkOtlpBench BROKERS TOPIC CATALOG_URI TABLE");
      System.exit(2);
    }
    String brokers = args[0];
    String topic = args[1];
    String catalogUri = args[2];
    String tableName = args[3];

    Map<String, String> catalogProps = new HashMap<>();
    catalogProps.put("uri", catalogUri);
    org.apache.hadoop.conf.Configuration hadoopConf = new org.apache.hadoop.conf.Configuration();
    // Write file:// warehouses without Hadoop's .crc side files, as the other writers do.
    hadoopConf.set("fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem");
    CatalogLoader catalogLoader = CatalogLoader.rest("floe", hadoopConf, catalogProps);
    TableIdentifier id = TableIdentifier.of(NAMESPACE, tableName);
    Schema schema = spansSchema();
    Catalog catalog = catalogLoader.loadCatalog();
    try {
      ensureTable(catalog, id, schema);
    } finally {
      if (catalog instanceof java.io.Closeable) {
        ((java.io.Closeable) catalog).close();
      }
    }

    Path work = Files.createTempDirectory("floe-flink-bench-");
    StreamExecutionEnvironment env = localEnvironment(work, new Configuration());

    KafkaSource<KafkaValue> source =
        KafkaSource.<KafkaValue>builder()
            .setBootstrapServers(brokers)
            .setTopics(topic)
            .setGroupId("floe-flink-bench-" + UUID.randomUUID())
            .setStartingOffsets(OffsetsInitializer.earliest())
            .setDeserializer(new KafkaValueDeserializer())
            .build();

    RowType rowType = FlinkSchemaUtil.convert(schema);
    DataStream<RowData> rows =
        env.fromSource(source, WatermarkStrategy.noWatermarks(), "kafka-otlp")
            .flatMap(new FlattenSpans())
            .returns(InternalTypeInfo.of(rowType))
            .name("flatten-spans");

    FlinkSink.forRowData(rows)
        .tableLoader(TableLoader.fromCatalog(catalogLoader, id))
        .append();

    System.err.printf(
        "flink-otlp-bench: %s/%s -> %s %s, checkpoints every %d ms in %s%n",
        brokers, topic, catalogUri, id, CHECKPOINT_INTERVAL_MS, work.resolve("checkpoints"));
    env.execute("floe-flink-otlp-bench");
  }

  /**
   * A local MiniCluster of {@link #PARALLELISM} with checkpoints every
   * {@link #CHECKPOINT_INTERVAL_MS} to {@code work/checkpoints}, Flink's scratch files (such as
   * the RPC jar it unpacks) in {@code work/tmp}, {@code work} removed when the JVM exits, and
   * object reuse on (the flatMaps build fresh rows for every span, so chained operators may
   * hand them on without a defensive deep copy). {@code conf} adds settings.
   */
  static StreamExecutionEnvironment localEnvironment(Path work, Configuration conf)
      throws java.io.IOException {
    Runtime.getRuntime().addShutdownHook(new Thread(() -> deleteTree(work)));
    Path checkpoints = Files.createDirectory(work.resolve("checkpoints"));
    Path scratch = Files.createDirectory(work.resolve("tmp"));
    conf.set(CoreOptions.TMP_DIRS, scratch.toString());
    conf.set(WebOptions.UPLOAD_DIR, scratch.toString());
    conf.set(CheckpointingOptions.CHECKPOINT_STORAGE, "filesystem");
    conf.set(CheckpointingOptions.CHECKPOINTS_DIRECTORY, checkpoints.toUri().toString());
    StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(conf);
    env.setParallelism(PARALLELISM);
    env.enableCheckpointing(CHECKPOINT_INTERVAL_MS);
    env.getConfig().enableObjectReuse();
    return env;
  }

  /** Best-effort removal of a directory tree. */
  static void deleteTree(Path root) {
    try (Stream<Path> paths = Files.walk(root)) {
      paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    } catch (java.io.IOException | java.io.UncheckedIOException e) {
      // Already gone, or still in use: nothing to do at exit.
    }
  }

  /** Creates the namespace and table when missing. */
  static void ensureTable(Catalog catalog, TableIdentifier id, Schema schema) {
    Namespace ns = id.namespace();
    if (catalog instanceof SupportsNamespaces) {
      SupportsNamespaces namespaces = (SupportsNamespaces) catalog;
      if (!namespaces.namespaceExists(ns)) {
        try {
          namespaces.createNamespace(ns);
        } catch (org.apache.iceberg.exceptions.AlreadyExistsException raced) {
          // Another run created it meanwhile.
        }
      }
    }
    if (!catalog.tableExists(id)) {
      PartitionSpec spec = PartitionSpec.builderFor(schema).day("ts").build();
      catalog
          .buildTable(id, schema)
          .withPartitionSpec(spec)
          .withProperty(TableProperties.FORMAT_VERSION, "2")
          .create();
    }
  }

  // ---- schema ----

  /** Hands out field ids in declaration order. */
  private static final class Ids {
    int next = 1;

    int id() {
      return next++;
    }
  }

  private static Types.NestedField opt(Ids ids, String name, Type type) {
    return Types.NestedField.optional(ids.id(), name, type);
  }

  private static Types.NestedField req(Ids ids, String name, Type type) {
    return Types.NestedField.required(ids.id(), name, type);
  }

  private static Type strMap(Ids ids) {
    return Types.MapType.ofOptional(
        ids.id(), ids.id(), Types.StringType.get(), Types.StringType.get());
  }

  /** The spans table, column for column as the README of this directory lists it. */
  static Schema spansSchema() {
    Ids ids = new Ids();
    Type tstz = Types.TimestampType.withZone();
    Type str = Types.StringType.get();
    Type i64 = Types.LongType.get();
    Type i32 = Types.IntegerType.get();
    Types.NestedField ts = req(ids, "ts", tstz);
    Types.NestedField start = opt(ids, "start_time_unix_nano", i64);
    Types.NestedField end = opt(ids, "end_time_unix_nano", i64);
    Types.NestedField duration = opt(ids, "duration_ns", i64);
    Types.NestedField traceId = opt(ids, "trace_id", str);
    Types.NestedField spanId = opt(ids, "span_id", str);
    Types.NestedField parentId = opt(ids, "parent_span_id", str);
    Types.NestedField isRoot = opt(ids, "is_root", Types.BooleanType.get());
    Types.NestedField traceState = opt(ids, "trace_state", str);
    Types.NestedField flags = opt(ids, "flags", i32);
    Types.NestedField name = opt(ids, "span_name", str);
    Types.NestedField kind = opt(ids, "span_kind", str);
    Types.NestedField statusCode = opt(ids, "status_code", str);
    Types.NestedField statusMessage = opt(ids, "status_message", str);
    Types.NestedField attrs = opt(ids, "span_attributes", strMap(ids));
    Types.NestedField droppedAttrs = opt(ids, "dropped_attributes_count", i32);
    Types.NestedField droppedEvents = opt(ids, "dropped_events_count", i32);
    Types.NestedField droppedLinks = opt(ids, "dropped_links_count", i32);
    int eventsId = ids.id();
    int eventId = ids.id();
    Types.StructType event =
        Types.StructType.of(
            opt(ids, "ts", tstz),
            opt(ids, "time_unix_nano", i64),
            opt(ids, "name", str),
            opt(ids, "attributes", strMap(ids)),
            opt(ids, "dropped_attributes_count", i32));
    Types.NestedField events =
        Types.NestedField.optional(eventsId, "events", Types.ListType.ofOptional(eventId, event));
    int linksId = ids.id();
    int linkId = ids.id();
    Types.StructType link =
        Types.StructType.of(
            opt(ids, "trace_id", str),
            opt(ids, "span_id", str),
            opt(ids, "trace_state", str),
            opt(ids, "flags", i32),
            opt(ids, "attributes", strMap(ids)),
            opt(ids, "dropped_attributes_count", i32));
    Types.NestedField links =
        Types.NestedField.optional(linksId, "links", Types.ListType.ofOptional(linkId, link));
    return new Schema(
        ts,
        start,
        end,
        duration,
        traceId,
        spanId,
        parentId,
        isRoot,
        traceState,
        flags,
        name,
        kind,
        statusCode,
        statusMessage,
        attrs,
        droppedAttrs,
        droppedEvents,
        droppedLinks,
        events,
        links,
        opt(ids, "service_name", str),
        opt(ids, "service_namespace", str),
        opt(ids, "service_instance_id", str),
        opt(ids, "deployment_environment", str),
        opt(ids, "resource_attributes", strMap(ids)),
        opt(ids, "resource_schema_url", str),
        opt(ids, "resource_dropped_attributes_count", i32),
        opt(ids, "scope_name", str),
        opt(ids, "scope_version", str),
        opt(ids, "scope_attributes", strMap(ids)),
        opt(ids, "scope_schema_url", str),
        req(ids, "kafka_topic", str),
        req(ids, "kafka_partition", i32),
        req(ids, "kafka_offset", i64),
        req(ids, "kafka_item", i32),
        req(ids, "ingested_at", tstz));
  }

  static final int COLUMNS = 36;

  // ---- Kafka ----

  /** One Kafka record: where it came from and its raw value. */
  public static final class KafkaValue {
    public String topic;
    public int partition;
    public long offset;
    public byte[] value;

    public KafkaValue() {}

    KafkaValue(String topic, int partition, long offset, byte[] value) {
      this.topic = topic;
      this.partition = partition;
      this.offset = offset;
      this.value = value;
    }
  }

  static final class KafkaValueDeserializer implements KafkaRecordDeserializationSchema<KafkaValue> {
    private static final long serialVersionUID = 1L;

    @Override
    public void deserialize(ConsumerRecord<byte[], byte[]> record, Collector<KafkaValue> out) {
      if (record.value() != null) {
        out.collect(
            new KafkaValue(record.topic(), record.partition(), record.offset(), record.value()));
      }
    }

    @Override
    public TypeInformation<KafkaValue> getProducedType() {
      return TypeInformation.of(KafkaValue.class);
    }
  }

  // ---- flattening ----

  /** Decodes one record's TracesData and emits one row per span. */
  static final class FlattenSpans implements FlatMapFunction<KafkaValue, RowData> {
    private static final long serialVersionUID = 1L;

    @Override
    public void flatMap(KafkaValue in, Collector<RowData> out) throws Exception {
      TracesData data = TracesData.parseFrom(in.value);
      TimestampData ingestedAt = TimestampData.fromInstant(Instant.now());
      StringData topic = StringData.fromString(in.topic);
      int item = 0;
      for (ResourceSpans rs : data.getResourceSpansList()) {
        Resource resource = rs.getResource();
        Promoted promoted = Promoted.of(resource.getAttributesList());
        GenericMapData resourceAttrs = attributes(resource.getAttributesList());
        StringData resourceSchemaUrl = text(rs.getSchemaUrlBytes());
        for (ScopeSpans ss : rs.getScopeSpansList()) {
          InstrumentationScope scope = ss.getScope();
          StringData scopeName = text(scope.getNameBytes());
          StringData scopeVersion = text(scope.getVersionBytes());
          GenericMapData scopeAttrs = attributes(scope.getAttributesList());
          StringData scopeSchemaUrl = text(ss.getSchemaUrlBytes());
          for (Span span : ss.getSpansList()) {
            GenericRowData row = new GenericRowData(COLUMNS);
            long start = span.getStartTimeUnixNano();
            long end = span.getEndTimeUnixNano();
            Status status = span.getStatus();
            int c = 0;
            row.setField(c++, timestamp(start));
            row.setField(c++, start);
            row.setField(c++, end);
            row.setField(c++, Long.compareUnsigned(end, start) > 0 ? end - start : 0L);
            row.setField(c++, hexId(span.getTraceId()));
            row.setField(c++, hexId(span.getSpanId()));
            row.setField(c++, hexId(span.getParentSpanId()));
            row.setField(c++, isZero(span.getParentSpanId()));
            row.setField(c++, text(span.getTraceStateBytes()));
            row.setField(c++, span.getFlags());
            row.setField(c++, bytes(span.getNameBytes()));
            row.setField(c++, KINDS[kindIndex(span.getKindValue())]);
            row.setField(c++, STATUSES[statusIndex(status.getCodeValue())]);
            row.setField(c++, text(status.getMessageBytes()));
            row.setField(c++, attributes(span.getAttributesList()));
            row.setField(c++, span.getDroppedAttributesCount());
            row.setField(c++, span.getDroppedEventsCount());
            row.setField(c++, span.getDroppedLinksCount());
            row.setField(c++, events(span.getEventsList()));
            row.setField(c++, links(span.getLinksList()));
            row.setField(c++, promoted.serviceName);
            row.setField(c++, promoted.serviceNamespace);
            row.setField(c++, promoted.serviceInstanceId);
            row.setField(c++, promoted.deploymentEnvironment);
            row.setField(c++, resourceAttrs);
            row.setField(c++, resourceSchemaUrl);
            row.setField(c++, resource.getDroppedAttributesCount());
            row.setField(c++, scopeName);
            row.setField(c++, scopeVersion);
            row.setField(c++, scopeAttrs);
            row.setField(c++, scopeSchemaUrl);
            row.setField(c++, topic);
            row.setField(c++, in.partition);
            row.setField(c++, in.offset);
            row.setField(c++, item++);
            row.setField(c++, ingestedAt);
            out.collect(row);
          }
        }
      }
    }
  }

  private static final StringData[] KINDS = {
    StringData.fromString("UNSPECIFIED"),
    StringData.fromString("INTERNAL"),
    StringData.fromString("SERVER"),
    StringData.fromString("CLIENT"),
    StringData.fromString("PRODUCER"),
    StringData.fromString("CONSUMER"),
  };

  private static final StringData[] STATUSES = {
    StringData.fromString("UNSET"), StringData.fromString("OK"), StringData.fromString("ERROR"),
  };

  private static int kindIndex(int kind) {
    return kind >= 1 && kind <= 5 ? kind : 0;
  }

  private static int statusIndex(int code) {
    return code == 1 || code == 2 ? code : 0;
  }

  private static GenericArrayData events(List<Span.Event> events) {
    Object[] out = new Object[events.size()];
    for (int i = 0; i < out.length; i++) {
      Span.Event e = events.get(i);
      long t = e.getTimeUnixNano();
      out[i] =
          GenericRowData.of(
              timestamp(t),
              t,
              bytes(e.getNameBytes()),
              attributes(e.getAttributesList()),
              e.getDroppedAttributesCount());
    }
    return new GenericArrayData(out);
  }

  private static GenericArrayData links(List<Span.Link> links) {
    Object[] out = new Object[links.size()];
    for (int i = 0; i < out.length; i++) {
      Span.Link l = links.get(i);
      out[i] =
          GenericRowData.of(
              hexId(l.getTraceId()),
              hexId(l.getSpanId()),
              text(l.getTraceStateBytes()),
              l.getFlags(),
              attributes(l.getAttributesList()),
              l.getDroppedAttributesCount());
    }
    return new GenericArrayData(out);
  }

  /** The resource attributes that get columns of their own. */
  private static final class Promoted {
    StringData serviceName;
    StringData serviceNamespace;
    StringData serviceInstanceId;
    StringData deploymentEnvironment;

    static Promoted of(List<KeyValue> attrs) {
      Promoted p = new Promoted();
      StringData legacyEnvironment = null;
      for (KeyValue kv : attrs) {
        if (!kv.hasValue()) {
          continue;
        }
        switch (kv.getKey()) {
          case "service.name":
            p.serviceName = StringData.fromString(anyToString(kv.getValue()));
            break;
          case "service.namespace":
            p.serviceNamespace = StringData.fromString(anyToString(kv.getValue()));
            break;
          case "service.instance.id":
            p.serviceInstanceId = StringData.fromString(anyToString(kv.getValue()));
            break;
          case "deployment.environment.name":
            p.deploymentEnvironment = StringData.fromString(anyToString(kv.getValue()));
            break;
          case "deployment.environment":
            legacyEnvironment = StringData.fromString(anyToString(kv.getValue()));
            break;
          default:
            break;
        }
      }
      if (p.serviceName == null) {
        p.serviceName = StringData.fromString("unknown_service");
      }
      if (p.deploymentEnvironment == null) {
        p.deploymentEnvironment = legacyEnvironment;
      }
      return p;
    }
  }

  // ---- value conversions ----

  /** Start/event time (ns since the epoch, unsigned) as a microsecond timestamp. */
  static TimestampData timestamp(long unixNano) {
    long micros = Long.divideUnsigned(unixNano, 1_000L);
    return TimestampData.fromEpochMillis(micros / 1_000L, (int) (micros % 1_000L) * 1_000);
  }

  /** UTF-8 bytes as a string value, without decoding them. */
  static StringData bytes(ByteString s) {
    return StringData.fromBytes(s.toByteArray());
  }

  /** A string field where empty means "not set". */
  static StringData text(ByteString s) {
    return s.isEmpty() ? null : bytes(s);
  }

  static boolean isZero(ByteString id) {
    for (int i = 0; i < id.size(); i++) {
      if (id.byteAt(i) != 0) {
        return false;
      }
    }
    return true;
  }

  private static final byte[] HEX = "0123456789abcdef".getBytes();

  /** Lowercase hex of an id; null for an empty or all-zero one. */
  static StringData hexId(ByteString id) {
    if (isZero(id)) {
      return null;
    }
    byte[] out = new byte[id.size() * 2];
    for (int i = 0; i < id.size(); i++) {
      int b = id.byteAt(i) & 0xff;
      out[2 * i] = HEX[b >>> 4];
      out[2 * i + 1] = HEX[b & 0x0f];
    }
    return StringData.fromBytes(out);
  }

  static GenericMapData attributes(List<KeyValue> attrs) {
    Map<Object, Object> map = new HashMap<>(Math.max(4, attrs.size() * 2));
    for (KeyValue kv : attrs) {
      Object value = null;
      if (kv.hasValue() && kv.getValue().getValueCase() != AnyValue.ValueCase.VALUE_NOT_SET) {
        AnyValue v = kv.getValue();
        value =
            v.getValueCase() == AnyValue.ValueCase.STRING_VALUE
                ? bytes(v.getStringValueBytes())
                : StringData.fromString(anyToString(v));
      }
      map.put(bytes(kv.getKeyBytes()), value);
    }
    return new GenericMapData(map);
  }

  /** Scalars as text, bytes as base64, arrays and key-value lists as JSON. */
  static String anyToString(AnyValue v) {
    switch (v.getValueCase()) {
      case STRING_VALUE:
        return v.getStringValue();
      case BOOL_VALUE:
        return v.getBoolValue() ? "true" : "false";
      case INT_VALUE:
        return Long.toString(v.getIntValue());
      case DOUBLE_VALUE:
        return Double.toString(v.getDoubleValue());
      case BYTES_VALUE:
        return Base64.getEncoder().encodeToString(v.getBytesValue().toByteArray());
      case ARRAY_VALUE:
      case KVLIST_VALUE:
        {
          StringBuilder sb = new StringBuilder();
          json(v, sb);
          return sb.toString();
        }
      default:
        return "";
    }
  }

  private static void json(AnyValue v, StringBuilder sb) {
    switch (v.getValueCase()) {
      case STRING_VALUE:
        jsonString(v.getStringValue(), sb);
        break;
      case BOOL_VALUE:
        sb.append(v.getBoolValue());
        break;
      case INT_VALUE:
        sb.append(v.getIntValue());
        break;
      case DOUBLE_VALUE:
        {
          double d = v.getDoubleValue();
          if (Double.isFinite(d)) {
            sb.append(d);
          } else {
            sb.append("null");
          }
          break;
        }
      case BYTES_VALUE:
        jsonString(Base64.getEncoder().encodeToString(v.getBytesValue().toByteArray()), sb);
        break;
      case ARRAY_VALUE:
        {
          sb.append('[');
          List<AnyValue> values = v.getArrayValue().getValuesList();
          for (int i = 0; i < values.size(); i++) {
            if (i > 0) {
              sb.append(',');
            }
            json(values.get(i), sb);
          }
          sb.append(']');
          break;
        }
      case KVLIST_VALUE:
        {
          sb.append('{');
          List<KeyValue> values = v.getKvlistValue().getValuesList();
          for (int i = 0; i < values.size(); i++) {
            if (i > 0) {
              sb.append(',');
            }
            jsonString(values.get(i).getKey(), sb);
            sb.append(':');
            json(values.get(i).getValue(), sb);
          }
          sb.append('}');
          break;
        }
      default:
        sb.append("null");
    }
  }

  private static void jsonString(String s, StringBuilder sb) {
    sb.append('"');
    for (int i = 0; i < s.length(); i++) {
      char ch = s.charAt(i);
      switch (ch) {
        case '"':
          sb.append("\\\"");
          break;
        case '\\':
          sb.append("\\\\");
          break;
        case '\n':
          sb.append("\\n");
          break;
        case '\r':
          sb.append("\\r");
          break;
        case '\t':
          sb.append("\\t");
          break;
        default:
          if (ch < 0x20) {
            sb.append(String.format("\\u%04x", (int) ch));
          } else {
            sb.append(ch);
          }
      }
    }
    sb.append('"');
  }
}
