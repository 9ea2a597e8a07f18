package duotf.jvm;

import java.io.Serializable;
import java.util.Iterator;

import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeArrayData;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BinaryType$;
import org.apache.spark.sql.types.ByteType$;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DoubleType$;
import org.apache.spark.sql.types.FloatType$;
import org.apache.spark.sql.types.IntegerType$;
import org.apache.spark.sql.types.LongType$;
import org.apache.spark.sql.types.ShortType$;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;

/**
 * duotf's JVM side of the Spark feed: columns of numeric arrays moved out of the JVM (and back)
 * as binary values holding the raw elements, one memory copy a row.
 *
 * <p>Spark's Arrow writer turns an {@code array<float>} column into Arrow one element at a
 * time; a binary column it copies as one buffer. {@link #pack} turns each named array column
 * into a binary column of the array's elements in native byte order (a row with a null element
 * becomes the one-byte value {@code {0}}, which no element size divides: the Python side names
 * the row), and {@link #unpack} turns such binary columns back into arrays of the given schema.
 * Every other column passes unchanged, and the partitions stay those of the input.
 */
public final class ArrayPacking {
  private ArrayPacking() {}

  /** The one-byte value of a row whose array holds a null element. */
  static final byte[] NULL_INSIDE = new byte[] {0};

  /** {@code df} with the array columns {@code names} as binary columns of their raw elements. */
  public static Dataset<Row> pack(Dataset<Row> df, java.util.List<String> names) {
    StructType schema = df.schema();
    StructField[] fields = schema.fields().clone();
    Rows rows = new Rows(schema, false);
    for (String name : names) {
      int i = schema.fieldIndex(name);
      ArrayType type = (ArrayType) fields[i].dataType();
      rows.set(i, type.elementType(), type.containsNull());
      fields[i] = new StructField(fields[i].name(), BinaryType$.MODULE$, true, fields[i].metadata());
    }
    return create(df, Classic.queryExecution(df).toRdd(), rows, new StructType(fields));
  }

  /** {@code df} with its binary columns that {@code target} (a schema as JSON) gives as arrays
   *  turned back into those arrays: the inverse of {@link #pack}. */
  public static Dataset<Row> unpack(Dataset<Row> df, String target) {
    StructType schema = df.schema();
    StructType to = (StructType) DataType.fromJson(target);
    StructField[] fields = schema.fields().clone();
    Rows rows = new Rows(schema, true);
    for (int i = 0; i < fields.length; i++) {
      if (fields[i].dataType() instanceof BinaryType$ && to.fields()[i].dataType() instanceof ArrayType) {
        ArrayType type = (ArrayType) to.fields()[i].dataType();
        rows.set(i, type.elementType(), false);
        fields[i] = new StructField(fields[i].name(), type, fields[i].nullable(), fields[i].metadata());
      }
    }
    return create(df, Classic.queryExecution(df).toRdd(), rows, new StructType(fields));
  }

  private static Dataset<Row> create(Dataset<Row> df, RDD<InternalRow> in, Rows rows, StructType schema) {
    RDD<InternalRow> out = in.toJavaRDD().mapPartitions(rows).rdd();
    return Classic.create(df, out, schema);
  }

  /** Copy the {@code bytes} bytes of the elements of {@code array} (of {@code element}s, not an
   *  UnsafeArrayData, whose bytes the callers copy directly) to {@code to} at {@code at}. */
  static void copyElements(ArrayData array, DataType element, Object to, long at, long bytes) {
    Object values;
    long from;
    if (element instanceof FloatType$) { values = array.toFloatArray(); from = Platform.FLOAT_ARRAY_OFFSET; }
    else if (element instanceof DoubleType$) { values = array.toDoubleArray(); from = Platform.DOUBLE_ARRAY_OFFSET; }
    else if (element instanceof IntegerType$) { values = array.toIntArray(); from = Platform.INT_ARRAY_OFFSET; }
    else if (element instanceof LongType$) { values = array.toLongArray(); from = Platform.LONG_ARRAY_OFFSET; }
    else if (element instanceof ShortType$) { values = array.toShortArray(); from = Platform.SHORT_ARRAY_OFFSET; }
    else { values = array.toByteArray(); from = Platform.BYTE_ARRAY_OFFSET; }
    Platform.copyMemory(values, from, to, at, bytes);
  }

  /** Element kinds: the element's size in bytes, and whether it is a floating-point type. */
  static int size(DataType element) {
    if (element instanceof FloatType$ || element instanceof IntegerType$) return 4;
    if (element instanceof DoubleType$ || element instanceof LongType$) return 8;
    if (element instanceof ShortType$) return 2;
    if (element instanceof ByteType$) return 1;
    throw new IllegalArgumentException("duotf: cannot pack arrays of " + element.simpleString());
  }

  static final class Rows implements FlatMapFunction<Iterator<InternalRow>, InternalRow>, Serializable {
    private static final long serialVersionUID = 1L;
    final DataType[] types;
    final DataType[] elements;  // null: the column passes unchanged
    final int[] sizes;
    final boolean[] nullsInside;
    final boolean unpack;

    Rows(StructType schema, boolean unpack) {
      int n = schema.fields().length;
      types = new DataType[n];
      for (int i = 0; i < n; i++) types[i] = schema.fields()[i].dataType();
      elements = new DataType[n];
      sizes = new int[n];
      nullsInside = new boolean[n];
      this.unpack = unpack;
    }

    void set(int i, DataType element, boolean containsNull) {
      elements[i] = element;
      sizes[i] = size(element);
      nullsInside[i] = containsNull;
    }

    @Override
    public Iterator<InternalRow> call(Iterator<InternalRow> in) {
      Converter converter = new Converter(this);
      return new Iterator<InternalRow>() {
        @Override public boolean hasNext() { return in.hasNext(); }
        @Override public InternalRow next() { return converter.convert(in.next()); }
      };
    }
  }

  /**
   * One partition's conversion. The row it returns, and the packed or unpacked values in it, are
   * reused for the next row: the rows go only into the scan of the DataFrame {@link #create}
   * builds, which copies each row (into an UnsafeRow) before it asks for the next, as Spark's
   * operators do with rows they did not make. A row is no longer three fresh copies of its
   * array (a byte[], an array, a row), which the executors' heap then had to collect.
   */
  static final class Converter {
    final Rows spec;
    final Object[] values;
    final GenericInternalRow row;
    final byte[][] buffers;  // per converted column: the last packed value, or unpacked array's bytes
    final UnsafeArrayData[] arrays;

    Converter(Rows spec) {
      this.spec = spec;
      int n = spec.types.length;
      values = new Object[n];
      row = new GenericInternalRow(values);
      buffers = new byte[n][];
      arrays = new UnsafeArrayData[n];
    }

    InternalRow convert(InternalRow in) {
      for (int i = 0; i < values.length; i++) {
        if (in.isNullAt(i)) {
          values[i] = null;
        } else if (spec.elements[i] == null) {
          values[i] = in.get(i, spec.types[i]);  // the scan copies it
        } else if (spec.unpack) {
          values[i] = toArray(in, i);
        } else {
          values[i] = toBinary(in.getArray(i), i);
        }
      }
      return row;
    }

    byte[] buffer(int i, int bytes) {
      byte[] buffer = buffers[i];
      if (buffer == null || buffer.length != bytes) buffer = buffers[i] = new byte[bytes];
      return buffer;
    }

    Object toBinary(ArrayData array, int i) {
      int n = array.numElements();
      int size = spec.sizes[i];
      if (spec.nullsInside[i]) {
        for (int j = 0; j < n; j++) {
          if (array.isNullAt(j)) return NULL_INSIDE;
        }
      }
      byte[] out = buffer(i, n * size);
      if (array instanceof UnsafeArrayData) {
        UnsafeArrayData unsafe = (UnsafeArrayData) array;
        Platform.copyMemory(unsafe.getBaseObject(),
                            unsafe.getBaseOffset() + UnsafeArrayData.calculateHeaderPortionInBytes(n),
                            out, Platform.BYTE_ARRAY_OFFSET, (long) n * size);
        return out;
      }
      copyElements(array, spec.elements[i], out, Platform.BYTE_ARRAY_OFFSET, (long) n * size);
      return out;
    }

    /** The binary column {@code i} of {@code in} as an array, written once, from the row's own
     *  bytes where it is an UnsafeRow, into this column's reused buffer. */
    Object toArray(InternalRow in, int i) {
      int size = spec.sizes[i];
      Object base;
      long offset;
      int bytes;
      if (in instanceof UnsafeRow) {
        UnsafeRow unsafe = (UnsafeRow) in;
        long offsetAndSize = unsafe.getLong(i);
        base = unsafe.getBaseObject();
        offset = unsafe.getBaseOffset() + (int) (offsetAndSize >> 32);
        bytes = (int) offsetAndSize;
      } else {
        byte[] value = in.getBinary(i);
        base = value;
        offset = Platform.BYTE_ARRAY_OFFSET;
        bytes = value.length;
      }
      if (bytes % size != 0) {
        throw new IllegalStateException("duotf: a packed " + spec.elements[i].simpleString() + " array of "
                                        + bytes + " bytes");
      }
      int n = bytes / size;
      int header = UnsafeArrayData.calculateHeaderPortionInBytes(n);
      int total = header + (int) ((bytes + 7L) / 8 * 8);
      byte[] buffer = buffers[i];
      if (buffer == null || arrays[i].numElements() != n) {  // a fresh one: no null bits, zero padding
        buffer = buffers[i] = new byte[total];
        Platform.putLong(buffer, Platform.BYTE_ARRAY_OFFSET, n);
        arrays[i] = new UnsafeArrayData();
        arrays[i].pointTo(buffer, Platform.BYTE_ARRAY_OFFSET, total);
      }
      Platform.copyMemory(base, offset, buffer, Platform.BYTE_ARRAY_OFFSET + header, bytes);
      return arrays[i];
    }
  }
}
