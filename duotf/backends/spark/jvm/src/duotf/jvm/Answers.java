package duotf.jvm;

import java.io.Serializable;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;

import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.function.FlatMapFunction2;
import org.apache.spark.rdd.DeterministicLevel$;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.execution.QueryExecution;
import org.apache.spark.sql.execution.adaptive.AdaptiveSparkPlanExec;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * Inference's answers beside the rows they answer, without the rows passing through Python.
 *
 * <p>The nodes' answers are kept (checkpointed) alone, in the partitions and the order of the
 * DataFrame the nodes read. {@link #beside} pairs them again with the columns the user keeps,
 * row {@code i} of partition {@code p} with answer {@code i} of partition {@code p}, each time the
 * result is read: the kept columns are then computed from the DataFrame again, as every Spark
 * transformation's output is. That is sound only where the DataFrame gives the same rows, in the
 * same order, each time: {@link #repeatable} says so (every expression of its plan deterministic,
 * and no shuffle whose output order may differ). A partition that still comes back with more or
 * fewer rows than it was answered with fails the read, naming the partition: never a row beside
 * another row's answer.
 */
public final class Answers {
  private Answers() {}

  /** Whether {@code df} computes the same rows, in the same order, each time it is computed. */
  public static boolean repeatable(Dataset<Row> df) {
    QueryExecution c = Classic.queryExecution(df);
    if (!c.optimizedPlan().deterministic()) return false;
    // adaptive execution plans only around a shuffle (or subquery), and would run the shuffle's
    // jobs to give the RDD asked for below: such a plan is not taken for repeatable
    if (c.executedPlan() instanceof AdaptiveSparkPlanExec) return false;
    return c.toRdd().outputDeterministicLevel() == DeterministicLevel$.MODULE$.DETERMINATE();
  }

  /** The number of partitions {@code df} is computed in. */
  public static int partitions(Dataset<Row> df) {
    return Classic.queryExecution(df).toRdd().getNumPartitions();
  }

  /** {@code source}'s columns {@code keep} beside every column of {@code answers}. */
  public static Dataset<Row> beside(Dataset<Row> source, List<String> keep, Dataset<Row> answers) {
    StructType from = source.schema();
    StructType with = answers.schema();
    int[] picks = new int[keep.size()];
    DataType[] types = new DataType[keep.size() + with.fields().length];
    StructField[] fields = new StructField[types.length];
    for (int k = 0; k < picks.length; k++) {
      picks[k] = from.fieldIndex(keep.get(k));
      fields[k] = from.fields()[picks[k]];
    }
    for (int j = 0; j < with.fields().length; j++) fields[picks.length + j] = with.fields()[j];
    for (int i = 0; i < fields.length; i++) types[i] = fields[i].dataType();
    RDD<InternalRow> rows = Classic.queryExecution(source).toRdd();
    RDD<InternalRow> answered = Classic.queryExecution(answers).toRdd();
    if (rows.getNumPartitions() != answered.getNumPartitions()) {
      throw new IllegalStateException("duotf: the DataFrame has " + rows.getNumPartitions()
                                      + " partitions and its answers " + answered.getNumPartitions());
    }
    JavaRDD<InternalRow> out = rows.toJavaRDD().zipPartitions(answered.toJavaRDD(), new Pairing(picks, types));
    return Classic.create(source, out.rdd(), new StructType(fields));
  }

  static final class Pairing
      implements FlatMapFunction2<Iterator<InternalRow>, Iterator<InternalRow>, InternalRow>, Serializable {
    private static final long serialVersionUID = 1L;
    final int[] picks;
    final DataType[] types;

    Pairing(int[] picks, DataType[] types) {
      this.picks = picks;
      this.types = types;
    }

    @Override
    public Iterator<InternalRow> call(Iterator<InternalRow> rows, Iterator<InternalRow> answers) {
      Object[] values = new Object[types.length];
      GenericInternalRow row = new GenericInternalRow(values);  // reused: the scan copies each row
      int partition = TaskContext.getPartitionId();
      return new Iterator<InternalRow>() {
        long paired = 0;

        @Override public boolean hasNext() {
          boolean more = rows.hasNext();
          if (more != answers.hasNext()) {
            throw new IllegalStateException(
                "duotf: partition " + partition + " of the DataFrame given to inference() "
                + (more ? "has more than the " + paired + " rows" : "has " + paired + " rows, fewer than the")
                + " its answers were made for: computed again, it does not give the same rows. "
                + "persist() or localCheckpoint() the DataFrame before inference()");
          }
          return more;
        }

        @Override public InternalRow next() {
          if (!hasNext()) throw new NoSuchElementException();
          InternalRow a = rows.next();
          InternalRow b = answers.next();
          for (int k = 0; k < picks.length; k++) {
            values[k] = a.isNullAt(picks[k]) ? null : a.get(picks[k], types[k]);
          }
          for (int j = picks.length; j < types.length; j++) {
            values[j] = b.isNullAt(j - picks.length) ? null : b.get(j - picks.length, types[j]);
          }
          paired++;
          return row;
        }
      };
    }
  }
}
