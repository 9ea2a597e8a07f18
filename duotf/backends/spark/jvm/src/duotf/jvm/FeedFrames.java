package duotf.jvm;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.Serializable;
import java.net.InetAddress;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.Iterator;
import java.util.UUID;

import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeArrayData;
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
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * duotf's JVM side of the Spark feed, second part: a DataFrame of numbers (numeric columns and
 * numeric array columns) written, partition by partition, straight from the JVM into files of
 * the feed's own frames, the files a {@code FeedCache} holds.
 *
 * <p>A tensor column ({@code duotf.spark.pack_tensors}: binary values of a fixed shape and
 * number type, named in {@code tensors}) is written as the rows' bytes, of that shape.
 *
 * <p>{@link #spill} is the first pass of {@code cluster.train(df, epochs > 1)}: each task writes
 * its partition into a file in its executor's local dir (the dir Spark gives its Python workers
 * as {@code SPARK_LOCAL_DIRS}, under {@code duotf-feedcache-<id>}) and yields one row: where the
 * file lies, the frames in it, and the partition's rows, which are the feed's count. No row
 * passes through Arrow or a Python worker. The frames are those {@code duotf.feed.wire.pack_frame}
 * writes: a 4-byte big-endian length, a JSON header padded with spaces to 64 bytes, each column's
 * raw elements in native byte order padded to 64 bytes; each frame starts a 4096-byte page.
 *
 * <p>A partition the feed would refuse (a null, an array null inside, array rows of different
 * lengths, empty arrays, a tensor value of another size) is not written: its row has no path, only its count, and the feed
 * reads that partition from the DataFrame, where the Python side names the column and the row. A
 * disk that would fall below its floor stops the writing the same way.
 */
public final class FeedFrames {
  private FeedFrames() {}

  /**
   * {@code {the index of df written into feed frames (one row a partition, see the class), the
   * RDD that holds it}}. The RDD is locally checkpointed: its first job writes the frames, and
   * each index row then stays in the memory (or on the disk) of the executor whose disk holds
   * its file, so a task reading it runs there, and the writing is never run again. Unpersist
   * the RDD when the files are gone.
   */
  public static Object[] spill(Dataset<Row> df, String cacheId, long blockBytes, long minFreeBytes,
                               double minFreeFraction, String errorColumn,
                               java.util.Map<String, String> tensors) {
    long block = Math.max(1, Math.min(blockBytes, 64L << 20));  // the frame buffers: 64 MiB at most
    Spill task = new Spill(df.schema(), tensors, cacheId, block, minFreeBytes, minFreeFraction);
    RDD<InternalRow> out = Classic.queryExecution(df).toRdd().toJavaRDD().mapPartitions(task).rdd();
    out.localCheckpoint();
    StructType index = StructType.fromDDL("pid long, host string, path string, frames string, rows long, `"
                                          + errorColumn + "` string");
    return new Object[] {Classic.create(df, out, index), out};
  }

  /** Whether {@link #spill} writes a column of this type. */
  static boolean writable(DataType type) {
    if (type instanceof ArrayType) {
      return element(((ArrayType) type).elementType()) > 0;
    }
    return element(type) > 0;
  }

  /** The size of a number type in bytes; 0 for any other type. */
  static int element(DataType type) {
    if (type instanceof FloatType$ || type instanceof IntegerType$) return 4;
    if (type instanceof DoubleType$ || type instanceof LongType$) return 8;
    if (type instanceof ShortType$) return 2;
    if (type instanceof ByteType$) return 1;
    return 0;
  }

  /** numpy's name of a number type in native byte order ({@code "<f4"}). */
  static String dtype(DataType type) {
    String order = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN ? "<" : ">";
    if (type instanceof FloatType$) return order + "f4";
    if (type instanceof DoubleType$) return order + "f8";
    if (type instanceof IntegerType$) return order + "i4";
    if (type instanceof LongType$) return order + "i8";
    if (type instanceof ShortType$) return order + "i2";
    return "|i1";
  }

  static String json(String s) {
    StringBuilder out = new StringBuilder("\"");
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c == '"' || c == '\\') out.append('\\').append(c);
      else if (c < 0x20) out.append(String.format("\\u%04x", (int) c));
      else out.append(c);
    }
    return out.append('"').toString();
  }

  static final class Spill implements FlatMapFunction<Iterator<InternalRow>, InternalRow>, Serializable {
    private static final long serialVersionUID = 1L;
    final String[] names;
    final DataType[] types;
    final DataType[] elements;  // the number type: the column's own, or its arrays' elements
    final boolean[] arrays;
    final boolean[] nullsInside;
    final String[] tensorDtypes;  // a tensor column's numpy type ("<f4"); null for other columns
    final int[] tensorItems;  // its item size in bytes
    final String[] tensorShapes;  // its shape, as JSON's list inside: "28, 28"
    final long[] tensorBytes;  // the bytes of one value
    final String cacheId;
    final long blockBytes;
    final long minFreeBytes;
    final double minFreeFraction;

    Spill(StructType schema, java.util.Map<String, String> tensors, String cacheId, long blockBytes,
          long minFreeBytes, double minFreeFraction) {
      int n = schema.fields().length;
      names = new String[n];
      types = new DataType[n];
      elements = new DataType[n];
      arrays = new boolean[n];
      nullsInside = new boolean[n];
      tensorDtypes = new String[n];
      tensorItems = new int[n];
      tensorShapes = new String[n];
      tensorBytes = new long[n];
      for (int i = 0; i < n; i++) {
        names[i] = schema.fields()[i].name();
        DataType type = schema.fields()[i].dataType();
        String tensor = tensors == null ? null : tensors.get(names[i]);
        if (tensor != null && type instanceof BinaryType$) {
          // "<dtype>|<item size>|<shape, comma-separated>"
          String[] spec = tensor.split("\\|", -1);
          types[i] = type;
          tensorDtypes[i] = spec[0];
          tensorItems[i] = Integer.parseInt(spec[1]);
          long count = 1;
          StringBuilder shape = new StringBuilder();
          for (String d : spec[2].isEmpty() ? new String[0] : spec[2].split(",")) {
            count *= Long.parseLong(d.trim());
            shape.append(shape.length() > 0 ? ", " : "").append(Long.parseLong(d.trim()));
          }
          tensorShapes[i] = shape.toString();
          tensorBytes[i] = count * tensorItems[i];
          continue;
        }
        if (!writable(type)) {
          throw new IllegalArgumentException("duotf: cannot write column " + names[i] + " of "
                                             + type.simpleString() + " into feed frames");
        }
        types[i] = type;
        arrays[i] = type instanceof ArrayType;
        elements[i] = arrays[i] ? ((ArrayType) type).elementType() : type;
        nullsInside[i] = arrays[i] && ((ArrayType) type).containsNull();
      }
      this.cacheId = cacheId;
      this.blockBytes = blockBytes;
      this.minFreeBytes = minFreeBytes;
      this.minFreeFraction = minFreeFraction;
    }

    @Override
    public Iterator<InternalRow> call(Iterator<InternalRow> in) throws Exception {
      Partition part = new Partition(this, TaskContext.getPartitionId());
      try {
        part.run(in);
      } catch (Throwable t) {
        part.discard();
        throw t;
      }
      return Collections.singletonList(part.entry()).iterator();
    }
  }

  /** One task's partition, written frame by frame. */
  static final class Partition {
    static final byte[] ZEROS = new byte[4096];
    final Spill spec;
    final int pid;
    final File folder;
    final File file;
    FileOutputStream out;
    boolean writing = true;  // false once the partition is refused or the disk is near full
    long rows = 0;
    long offset = 0;
    final StringBuilder frames = new StringBuilder("[");
    int[] widths;  // each column's elements a row (1: a number column)
    long[] rowBytes;
    byte[][] bufs;
    int perFrame;
    int fill = 0;

    Partition(Spill spec, int pid) throws IOException {
      this.spec = spec;
      this.pid = pid;
      File root = SparkEnv.get().blockManager().diskBlockManager().localDirs()[0];
      folder = new File(root, "duotf-feedcache-" + spec.cacheId);
      file = new File(folder, String.format("part-%05d-%s", pid,
                                            UUID.randomUUID().toString().replace("-", "").substring(0, 12)));
      for (int attempt = 0; ; attempt++) {  // another task of this cache may remove the folder, emptied
        folder.mkdirs();
        try {
          out = new FileOutputStream(file);
          break;
        } catch (IOException e) {
          if (attempt == 2) throw e;
        }
      }
    }

    void run(Iterator<InternalRow> in) throws IOException {
      while (in.hasNext()) {
        InternalRow row = in.next();
        rows++;
        if (!writing) continue;  // counted only
        if (widths == null && !start(row)) {
          refuse();
          continue;
        }
        if (!copy(row)) {
          refuse();
          continue;
        }
        if (++fill == perFrame) flush();
      }
      if (writing && fill > 0) flush();
      if (out != null) out.close();
    }

    /** The columns' widths from the partition's first row; false where the feed refuses it. */
    boolean start(InternalRow row) {
      int n = spec.names.length;
      widths = new int[n];
      rowBytes = new long[n];
      long total = 0;
      for (int i = 0; i < n; i++) {
        if (row.isNullAt(i)) return false;
        if (spec.tensorDtypes[i] != null) {
          widths[i] = 1;
          rowBytes[i] = spec.tensorBytes[i];
          if (rowBytes[i] == 0) return false;
          total += rowBytes[i];
          continue;
        }
        widths[i] = spec.arrays[i] ? row.getArray(i).numElements() : 1;
        if (widths[i] == 0) return false;
        rowBytes[i] = (long) widths[i] * element(spec.elements[i]);
        total += rowBytes[i];
      }
      perFrame = (int) Math.max(1, Math.min(Integer.MAX_VALUE, spec.blockBytes / Math.max(total, 1)));
      bufs = new byte[n][];
      for (int i = 0; i < n; i++) bufs[i] = new byte[(int) (perFrame * rowBytes[i])];
      return true;
    }

    /** Copy one row into the frame being filled; false where the feed refuses it. */
    boolean copy(InternalRow row) {
      for (int i = 0; i < spec.names.length; i++) {
        if (row.isNullAt(i)) return false;
        byte[] buf = bufs[i];
        long at = Platform.BYTE_ARRAY_OFFSET + fill * rowBytes[i];
        if (spec.tensorDtypes[i] != null) {
          byte[] value = row.getBinary(i);
          if (value.length != rowBytes[i]) return false;
          System.arraycopy(value, 0, buf, (int) (fill * rowBytes[i]), value.length);
          continue;
        }
        DataType type = spec.elements[i];
        if (!spec.arrays[i]) {
          if (type instanceof FloatType$) Platform.putFloat(buf, at, row.getFloat(i));
          else if (type instanceof DoubleType$) Platform.putDouble(buf, at, row.getDouble(i));
          else if (type instanceof LongType$) Platform.putLong(buf, at, row.getLong(i));
          else if (type instanceof IntegerType$) Platform.putInt(buf, at, row.getInt(i));
          else if (type instanceof ShortType$) Platform.putShort(buf, at, row.getShort(i));
          else Platform.putByte(buf, at, row.getByte(i));
          continue;
        }
        ArrayData array = row.getArray(i);
        int n = array.numElements();
        if (n != widths[i]) return false;
        if (array instanceof UnsafeArrayData) {
          UnsafeArrayData unsafe = (UnsafeArrayData) array;
          Object base = unsafe.getBaseObject();
          long start = unsafe.getBaseOffset();
          if (spec.nullsInside[i]) {
            for (int w = 0; w < (n + 63) / 64; w++) {
              if (Platform.getLong(base, start + 8 + 8L * w) != 0) return false;
            }
          }
          Platform.copyMemory(base, start + UnsafeArrayData.calculateHeaderPortionInBytes(n), buf, at, rowBytes[i]);
          continue;
        }
        if (spec.nullsInside[i]) {
          for (int j = 0; j < n; j++) {
            if (array.isNullAt(j)) return false;
          }
        }
        ArrayPacking.copyElements(array, type, buf, at, rowBytes[i]);
      }
      return true;
    }

    static int padding(long n, int align) {
      return (int) ((align - n % align) % align);
    }

    /** Write the frame filled so far (and the page's padding after it). */
    void flush() throws IOException {
      StringBuilder header = new StringBuilder("{\"t\": \"batch\", \"cols\": [");
      long body = 0;
      for (int i = 0; i < spec.names.length; i++) {
        long nbytes = fill * rowBytes[i];
        boolean tensor = spec.tensorDtypes[i] != null;
        header.append(i == 0 ? "" : ", ").append('[').append(json(spec.names[i])).append(", \"nd\", \"")
              .append(tensor ? spec.tensorDtypes[i] : dtype(spec.elements[i])).append("\", [")
              .append(tensor ? spec.tensorShapes[i] : spec.arrays[i] ? Integer.toString(widths[i]) : "")
              .append("], ").append(nbytes).append(']');
        body += nbytes + padding(nbytes, 64);
      }
      header.append("], \"rows\": ").append(fill).append('}');
      byte[] head = header.toString().getBytes(StandardCharsets.UTF_8);
      int headLength = head.length + padding(4 + head.length, 64);
      long length = 4 + headLength + body;
      if (!room(length + 4096)) {
        stopKeeping();
        return;
      }
      byte[] start = new byte[4 + headLength];
      start[0] = (byte) (headLength >>> 24);
      start[1] = (byte) (headLength >>> 16);
      start[2] = (byte) (headLength >>> 8);
      start[3] = (byte) headLength;
      System.arraycopy(head, 0, start, 4, head.length);
      for (int j = 4 + head.length; j < start.length; j++) start[j] = ' ';
      out.write(start);
      for (int i = 0; i < spec.names.length; i++) {
        long nbytes = fill * rowBytes[i];
        out.write(bufs[i], 0, (int) nbytes);
        out.write(ZEROS, 0, padding(nbytes, 64));
      }
      frames.append(frames.length() > 1 ? ", " : "").append('[').append(fill).append(", ").append(offset)
            .append(", ").append(length).append(']');
      offset += length;
      int pad = padding(offset, 4096);  // each frame starts a page: a node maps it where it lies
      out.write(ZEROS, 0, pad);
      offset += pad;
      fill = 0;
    }

    boolean room(long need) {
      long floor = Math.max(spec.minFreeBytes, (long) (spec.minFreeFraction * folder.getTotalSpace()));
      return folder.getUsableSpace() - need >= floor;
    }

    /** The feed refuses this partition: no file; the DataFrame's own feed names the row. */
    void refuse() throws IOException {
      stopKeeping();
    }

    void stopKeeping() throws IOException {
      writing = false;
      fill = 0;
      bufs = null;
      if (out != null) {
        out.close();
        out = null;
      }
      remove();
    }

    void discard() {
      try {
        if (out != null) out.close();
      } catch (IOException ignored) {
        // the file goes anyway
      }
      out = null;
      writing = false;
      remove();
    }

    void remove() {
      file.delete();
      folder.delete();  // the cache's folder, once its last file is gone
    }

    InternalRow entry() throws IOException {
      String host = InetAddress.getLocalHost().getHostName();
      boolean kept = writing;
      return new GenericInternalRow(new Object[] {
          (long) pid, UTF8String.fromString(host), UTF8String.fromString(kept ? file.getPath() : ""),
          UTF8String.fromString(kept ? frames.append(']').toString() : "[]"), rows, null});
    }
  }
}
