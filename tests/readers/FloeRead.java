// The Iceberg Java reader of the readers test (tests/python/test_readers.py): loads tables
// through a REST catalog with Iceberg Java's RESTCatalog and reads them with its generic data
// API (IcebergGenerics: data files with their position and equality deletes applied), printing
// every row as one line of canonical JSON — the form tests/python/readers.py turns every
// other engine's rows into, so that rows compare as strings:
//
//   integers, booleans, strings as JSON; floating point as JSON numbers, NaN and ±Infinity as
//   the strings "NaN", "Infinity", "-Infinity"; date: "YYYY-MM-DD"; time, timestamp and
//   timestamptz: microseconds (timestamp_ns: nanoseconds) since the epoch / midnight; decimal:
//   its plain string; uuid: lower-case string; binary and fixed: lower-case hex; struct: an
//   object by field name; list: an array; map: an array of [key, value] pairs in the order of
//   their keys' canonical JSON.
//
//   java -cp "classes:lib/*" FloeRead <catalog uri> <warehouse> <namespace.table>...
//
// prints "#table <name>" before each table's rows.
import java.io.BufferedOutputStream;
import java.io.PrintStream;
import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.LocalTime;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.Table;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.data.IcebergGenerics;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.rest.RESTCatalog;
import org.apache.iceberg.types.Type;
import org.apache.iceberg.types.Types;

public class FloeRead {
  private static final OffsetDateTime EPOCH = OffsetDateTime.of(1970, 1, 1, 0, 0, 0, 0, ZoneOffset.UTC);

  public static void main(String[] args) throws Exception {
    if (args.length < 3) {
      System.err.println("usage: FloeRead <catalog uri> <warehouse> <namespace.table>...");
      System.exit(2);
    }
    PrintStream out = new PrintStream(new BufferedOutputStream(System.out, 1 << 16), false, StandardCharsets.UTF_8);
    try (RESTCatalog catalog = new RESTCatalog()) {
      catalog.setConf(new Configuration());
      catalog.initialize("rest", Map.of("uri", args[0], "warehouse", args[1]));
      for (int i = 2; i < args.length; i++) {
        Table table = catalog.loadTable(TableIdentifier.parse(args[i]));
        Types.StructType schema = table.schema().asStruct();
        out.println("#table " + args[i]);
        try (CloseableIterable<Record> rows = IcebergGenerics.read(table).build()) {
          for (Record row : rows) {
            StringBuilder line = new StringBuilder();
            struct(line, row, schema);
            out.println(line);
          }
        }
      }
    }
    out.flush();
  }

  private static void struct(StringBuilder out, Record record, Types.StructType type) {
    // Keys in sorted order, as Python's json.dumps(sort_keys=True) writes them.
    List<Types.NestedField> fields = new ArrayList<>(type.fields());
    fields.sort((a, b) -> a.name().compareTo(b.name()));
    out.append('{');
    boolean first = true;
    for (Types.NestedField field : fields) {
      if (!first) out.append(", ");
      first = false;
      string(out, field.name());
      out.append(": ");
      value(out, record.getField(field.name()), field.type());
    }
    out.append('}');
  }

  private static void value(StringBuilder out, Object v, Type type) {
    if (v == null) {
      out.append("null");
      return;
    }
    switch (type.typeId()) {
      case BOOLEAN, INTEGER, LONG -> out.append(v);
      case FLOAT -> floating(out, ((Float) v).doubleValue());
      case DOUBLE -> floating(out, (Double) v);
      case STRING -> string(out, v.toString());
      case UUID -> {
        // The generic Parquet reader hands UUIDs over as their 16 bytes.
        java.util.UUID u;
        if (v instanceof byte[] b) {
          ByteBuffer bb = ByteBuffer.wrap(b);
          u = new java.util.UUID(bb.getLong(), bb.getLong());
        } else {
          u = (java.util.UUID) v;
        }
        string(out, u.toString());
      }
      case DECIMAL -> string(out, ((BigDecimal) v).toPlainString());
      case DATE -> string(out, ((LocalDate) v).toString());
      case TIME -> out.append(((LocalTime) v).toNanoOfDay() / 1000);
      case TIMESTAMP -> {
        OffsetDateTime t = v instanceof OffsetDateTime o ? o : ((LocalDateTime) v).atOffset(ZoneOffset.UTC);
        out.append(ChronoUnit.MICROS.between(EPOCH, t));
      }
      case TIMESTAMP_NANO -> {
        OffsetDateTime t = v instanceof OffsetDateTime o ? o : ((LocalDateTime) v).atOffset(ZoneOffset.UTC);
        out.append(ChronoUnit.NANOS.between(EPOCH, t));
      }
      case BINARY, FIXED -> {
        byte[] bytes;
        if (v instanceof ByteBuffer b) {
          ByteBuffer d = b.duplicate();
          bytes = new byte[d.remaining()];
          d.get(bytes);
        } else {
          bytes = (byte[]) v;
        }
        StringBuilder hex = new StringBuilder();
        for (byte x : bytes) hex.append(String.format("%02x", x));
        string(out, hex.toString());
      }
      case STRUCT -> struct(out, (Record) v, type.asStructType());
      case LIST -> {
        Type element = type.asListType().elementType();
        out.append('[');
        boolean first = true;
        for (Object e : (List<?>) v) {
          if (!first) out.append(", ");
          first = false;
          value(out, e, element);
        }
        out.append(']');
      }
      case MAP -> {
        Types.MapType map = type.asMapType();
        List<String[]> pairs = new ArrayList<>();
        for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
          StringBuilder k = new StringBuilder();
          StringBuilder val = new StringBuilder();
          value(k, e.getKey(), map.keyType());
          value(val, e.getValue(), map.valueType());
          pairs.add(new String[] {k.toString(), val.toString()});
        }
        pairs.sort((a, b) -> a[0].compareTo(b[0]));
        out.append('[');
        boolean first = true;
        for (String[] p : pairs) {
          if (!first) out.append(", ");
          first = false;
          out.append('[').append(p[0]).append(", ").append(p[1]).append(']');
        }
        out.append(']');
      }
      default -> throw new IllegalArgumentException("no canonical form for " + type);
    }
  }

  private static void floating(StringBuilder out, double d) {
    if (Double.isNaN(d)) out.append("\"NaN\"");
    else if (Double.isInfinite(d)) out.append(d > 0 ? "\"Infinity\"" : "\"-Infinity\"");
    else out.append(Double.toString(d));
  }

  private static void string(StringBuilder out, String s) {
    out.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        case '\b' -> out.append("\\b");
        case '\f' -> out.append("\\f");
        default -> {
          if (c < 0x20) out.append(String.format("\\u%04x", (int) c));
          else out.append(c);
        }
      }
    }
    out.append('"');
  }
}
