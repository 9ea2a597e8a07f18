package duotf.jvm;

import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.execution.QueryExecution;
import org.apache.spark.sql.types.StructType;

/**
 * What duotf's helpers need of a classic (not Spark Connect) Dataset, on Spark 4: there the
 * implementation is {@code org.apache.spark.sql.classic.Dataset}, under the API's abstract
 * {@code Dataset}. The same class for Spark 3 (src/spark3/) reads the one Dataset it has.
 */
final class Classic {
  private Classic() {}

  @SuppressWarnings("unchecked")
  static org.apache.spark.sql.classic.Dataset<Row> of(Dataset<Row> df) {
    return (org.apache.spark.sql.classic.Dataset<Row>) df;
  }

  static QueryExecution queryExecution(Dataset<Row> df) {
    return of(df).queryExecution();
  }

  /** A DataFrame of {@code rows} (of {@code schema}) in {@code df}'s session. */
  static Dataset<Row> create(Dataset<Row> df, RDD<InternalRow> rows, StructType schema) {
    return of(df).sparkSession().internalCreateDataFrame(rows, schema, false);
  }
}
