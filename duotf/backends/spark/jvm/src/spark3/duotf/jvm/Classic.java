package duotf.jvm;

import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.execution.QueryExecution;
import org.apache.spark.sql.types.StructType;

/**
 * What duotf's helpers need of a classic Dataset, on Spark 3: its one {@code Dataset} class
 * (Spark 4 splits it: src/spark4/).
 */
final class Classic {
  private Classic() {}

  static QueryExecution queryExecution(Dataset<Row> df) {
    return df.queryExecution();
  }

  /** A DataFrame of {@code rows} (of {@code schema}) in {@code df}'s session. */
  static Dataset<Row> create(Dataset<Row> df, RDD<InternalRow> rows, StructType schema) {
    return df.sparkSession().internalCreateDataFrame(rows, schema, false);
  }
}
